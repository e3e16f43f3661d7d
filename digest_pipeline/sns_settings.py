"""Which Amazon SNS topics may post SES events to `digest serve`, and where their certificates live.

`DIGEST_SES_TOPIC_ARNS` lists the topics (comma-separated ARNs) whose messages `/events/ses`
accepts; unset, the route answers 404. `DIGEST_SNS_CERT_HOST_PATTERN` is the regular expression
a signing certificate's host must match in full (`host`, or `host:port` for a port other than
443). Both are checked when the settings are read; a refusal is `InvalidSetting`, one line.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

from digest_pipeline.setting_values import InvalidSetting

TOPICS_VARIABLE = "DIGEST_SES_TOPIC_ARNS"
PATTERN_VARIABLE = "DIGEST_SNS_CERT_HOST_PATTERN"
#: SNS's own certificate hosts, `sns.<region>.amazonaws.com` (and `.com.cn` in China)
DEFAULT_CERT_HOST_PATTERN = r"sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?"
#: `arn:<partition>:sns:<region>:<account>:<topic name>`; a topic name is at most 256 letters,
#: digits, `-` and `_` (`.fifo` ends a FIFO topic's)
_TOPIC_ARN = re.compile(
    r"arn:aws[a-z-]*:sns:[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}:[0-9]{12}:[A-Za-z0-9_-]{1,256}(?:\.fifo)?"
)
#: hosts outside AWS: a pattern that matches one would trust a certificate anyone can serve
_FOREIGN_HOSTS = (
    "example.com",
    "sns.example.com",
    "sns.us-east-1.amazonaws.com.example.com",
    "amazonaws.com.example.com",
)


@dataclass(frozen=True)
class SnsSettings:
    """The SNS topics `/events/ses` accepts and the certificate hosts it trusts."""

    #: the topic ARNs of the SES configuration sets' event destinations
    topic_arns: frozenset[str]
    #: fullmatched against a certificate URL's host (`host:port` for a non-default port)
    cert_host_pattern: re.Pattern[str]


def read_sns(env: Mapping[str, str]) -> SnsSettings | None:
    """`DIGEST_SES_TOPIC_ARNS` and `DIGEST_SNS_CERT_HOST_PATTERN`; None when no topic is listed.

    Raises:
        InvalidSetting: an entry that is not an SNS topic ARN (named by position), or a pattern
            that does not compile or that matches a host outside AWS.
    """
    pattern = _pattern(env.get(PATTERN_VARIABLE, "").strip() or DEFAULT_CERT_HOST_PATTERN)
    topics: set[str] = set()
    for n, entry in enumerate(env.get(TOPICS_VARIABLE, "").split(","), start=1):
        arn = entry.strip()
        if not arn:
            continue
        if not _TOPIC_ARN.fullmatch(arn):
            raise InvalidSetting(
                f"{TOPICS_VARIABLE} entry {n}: not an SNS topic ARN "
                "(arn:aws:sns:<region>:<12-digit account>:<topic name>)"
            )
        topics.add(arn)
    if not topics:
        return None
    return SnsSettings(frozenset(topics), pattern)


def _pattern(raw: str) -> re.Pattern[str]:
    try:
        pattern = re.compile(raw)
    except re.error as e:
        raise InvalidSetting(f"{PATTERN_VARIABLE}: not a regular expression ({e.msg})") from e
    if any(pattern.fullmatch(host) for host in _FOREIGN_HOSTS):
        raise InvalidSetting(f"{PATTERN_VARIABLE}: matches hosts outside AWS, such as example.com")
    return pattern
