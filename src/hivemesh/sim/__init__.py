"""hivemesh.sim."""
