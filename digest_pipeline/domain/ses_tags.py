"""The operation key as an Amazon SES message tag value and back: what ties a send to its events.

SES tag values take only ASCII letters, digits, `_` and `-`, at most 256 of them (the SES v2
`MessageTag` reference), while a key holds `:` and `.` and runs to 160 characters. A key travels
as unpadded base64url of its ASCII text (at most 214 characters), which SES echoes in every event
of the message (`mail.tags.operation_key`); `key_of_tag` reads only what `tag_value` writes.
"""

import base64
import binascii
import re

from digest_pipeline.domain.errors import InvalidOperationKey
from digest_pipeline.domain.periods import OperationKey

#: the tag name the mailer sends and the SES event parser reads
TAG_NAME = "operation_key"
#: SES's limit on a tag value's length
MAX_TAG_LENGTH = 256
#: SES's alphabet for tag names and values; base64url's alphabet without `=` is exactly it
TAG_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


def tag_value(key: OperationKey | str) -> str:
    """`key` (an operation key or its text) as a tag value SES accepts: unpadded base64url."""
    return base64.urlsafe_b64encode(str(key).encode("ascii")).rstrip(b"=").decode("ascii")


def key_of_tag(value: object) -> OperationKey:
    """The operation key `tag_value` encoded as `value`.

    Raises:
        InvalidOperationKey: `value` is not a tag value `tag_value` writes for an operation key
            (the line never repeats it: a foreign tag could hold anything).
    """
    if (
        not isinstance(value, str)
        or len(value) > MAX_TAG_LENGTH
        or not TAG_ALPHABET.fullmatch(value)
    ):
        raise InvalidOperationKey("the SES tag is not an encoded operation key")
    try:
        text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode("ascii")
        key = OperationKey.parse(text)
    except (binascii.Error, UnicodeDecodeError, InvalidOperationKey):
        raise InvalidOperationKey("the SES tag is not an encoded operation key") from None
    # one key, one value: padding bits or whitespace around the key make another spelling
    if tag_value(key) != value:
        raise InvalidOperationKey("the SES tag is not an encoded operation key")
    return key
