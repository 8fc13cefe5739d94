"""Features of your own model: sparse dictionaries trained here, in SAELens's format (issue 49)."""
