"""Built-in env families: calculator, sql, files."""
