"""hivemesh.runtime."""
