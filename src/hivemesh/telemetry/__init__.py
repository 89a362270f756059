"""hivemesh.telemetry."""
