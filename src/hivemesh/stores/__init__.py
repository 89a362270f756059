"""hivemesh.stores."""
