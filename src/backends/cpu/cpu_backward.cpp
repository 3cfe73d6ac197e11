// STUB: cpu backward (owner: cpu helper).
