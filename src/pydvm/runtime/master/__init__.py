"""master room."""
