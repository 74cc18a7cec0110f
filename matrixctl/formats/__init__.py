"""One codec module per format: constants, header dataclass, read, write."""
