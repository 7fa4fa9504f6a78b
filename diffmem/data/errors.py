"""The one exception type of the data pipeline."""


class DataError(ValueError):
    """Bad or missing data (a wrong layout, an unreadable image, an impossible split).

    The message is one line that names the file or the setting at fault and says what to do.
    """
