"""What the executor shows: pages and printed reports (the logbook's index and lines)."""
