// STUB: C ABI (owner: validation helper).
