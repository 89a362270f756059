"""hivemesh.transports."""
