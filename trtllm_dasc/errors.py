"""Errors a user can fix; the CLI prints them as one line, servers return them as request errors."""
import contextlib


class UserError(ValueError):
    """Bad input: the message names the field or file and what is wrong with it."""


@contextlib.contextmanager
def naming_entry(index: int, count: int):
    """A refusal of one entry of several submitted as one (a Triton request's batch) says which entry: the
    client sees one error for the whole request. One entry alone: its error as it is."""
    try:
        yield
    except UserError as e:
        if count == 1:
            raise
        raise UserError(f"sequence {index} of the batch of {count}: {e}") from None
