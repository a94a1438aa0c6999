// Carries the precompiled header that the libraries and the CLI reuse.
