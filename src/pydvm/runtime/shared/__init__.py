"""shared room."""
