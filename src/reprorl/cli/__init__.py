"""The `reprorl` command line: parse arguments, call the library, print results."""
