"""Running candidates over cases: in this process, or in an isolated child process where
a crash or a hang becomes a verdict."""
