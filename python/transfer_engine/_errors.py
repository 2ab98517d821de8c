"""The exception raised by the methods beyond Mooncake's API."""


class TransferError(RuntimeError):
    """A transfer, registration or other engine call failed.

    ``str(error)`` is the engine's explanation; ``error.code`` is the integer
    Mooncake's corresponding method returns (-1 for a failed transfer, -3 for
    an address that is not registered, -7 for an overlap, ...).
    """

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        return (type(self), (str(self), self.code))
