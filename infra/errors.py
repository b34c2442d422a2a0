"""The one error type for bad kit settings."""


class ConfigError(ValueError):
    """A setting is missing or not allowed. The message is one line: key, value seen, what is allowed."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"{key}: {problem}".replace("\n", " "))


def require(cond: bool, key: str, problem: str) -> None:
    """Raise ConfigError(key, problem) unless cond holds: each rule reads as the condition it requires."""
    if not cond:
        raise ConfigError(key, problem)
