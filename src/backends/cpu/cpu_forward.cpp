// STUB: cpu forward (owner: cpu helper).
