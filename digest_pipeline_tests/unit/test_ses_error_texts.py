"""What SES says only in its error text, read and never echoed: a spent quota, a refused sender.

SES names a spent 24-hour quota, and the identity whose check failed, only in an error's message.
These are botocore's parsed answers as the mailer receives them; the text is read to classify the
answer and never reaches a detail (it may quote an address).
"""

import pytest

from digest_pipeline.adapters.mail.ses import error_outcome
from digest_pipeline.domain.breaker import credentials_refused
from digest_pipeline.domain.failures import FailureClass, SendOutcome


@pytest.mark.parametrize("code", ["Throttling", "ThrottlingException"])
def test_the_query_style_quota_answer_is_read_from_its_text_too(code: str) -> None:
    # SES's developer guide: the API says a spent quota as a throttling error whose message
    # is "Daily message quota exceeded"; the proxy speaks SES v2, so the parsed form is given
    def answer(text: str) -> dict[str, object]:
        return {
            "Error": {"Code": code, "Message": text},
            "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}},
        }

    outcome = error_outcome(answer("Daily message quota exceeded."))
    assert (outcome.detail, outcome.quota) == (f"ses:{code}:daily_quota", True)
    assert error_outcome(answer("Maximum sending rate exceeded.")) == SendOutcome.failed(
        FailureClass.THROTTLED, f"ses:{code}"
    )


@pytest.mark.parametrize(
    ("text", "senders"),
    [
        # SES's own words for an unverified sender: the sender's configuration
        (
            "Email address is not verified. The following identities failed the check in "
            "region EU-WEST-1: News@Shop.example",
            True,
        ),
        # an address the account may not send from (moto says it so too)
        ("Did not have authority to send from email news@shop.example", True),
        # at the end of a sentence
        ("Sending from news@shop.example is not allowed.", True),
        # a longer domain that begins like the sender's is another address
        ("Email address is not verified: news@shop.example.org", False),
        # a sandbox account's unverified recipient: that customer's alone
        (
            "Email address is not verified. The following identities failed the check in "
            "region EU-WEST-1: customer@mailbox.example",
            False,
        ),
        # a recipient whose address ends in the sender's is still the recipient
        (
            "Email address is not verified. The following identities failed the check in "
            "region EU-WEST-1: fakenews@shop.example",
            False,
        ),
        ("Illegal address", False),
    ],
)
def test_message_rejected_is_the_senders_only_when_it_names_the_sender(
    text: str, senders: bool
) -> None:
    answer = {
        "Error": {"Code": "MessageRejected", "Message": text},
        "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}},
    }
    outcome = error_outcome(answer, "news@shop.example")
    assert outcome.failure_class is FailureClass.PERMANENT
    assert credentials_refused(outcome) is senders
    assert "@" not in outcome.detail
