"""The figures of the README and the Results page's verdict table, written from results files."""
