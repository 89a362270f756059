"""hivemesh.leases."""
