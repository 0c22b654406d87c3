"""The chaos runner: scenarios against real workers and a private Redis (see issue 8)."""
