"""What every frontend shares: init, ranks and process sets (basics), Python
objects across ranks (objects), and the elastic loop's state (elastic)."""
