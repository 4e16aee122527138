"""The runtime tests are a package so that their fixtures (package scope) are removed, with their disk, as soon as
the directory is done, not at the end of the whole session."""
