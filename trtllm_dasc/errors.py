"""Errors a user can fix; the CLI prints them as one line, servers return them as request errors."""


class UserError(ValueError):
    """Bad input: the message names the field or file and what is wrong with it."""
