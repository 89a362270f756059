"""hivemesh.roles."""
