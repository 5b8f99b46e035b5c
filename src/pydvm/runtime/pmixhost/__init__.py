"""pmixhost room."""
