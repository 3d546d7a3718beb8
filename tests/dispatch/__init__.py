"""The dispatch guarantees D1-D13 of SPEC section 3, one module per guarantee."""
