"""dynask.control_plane."""
