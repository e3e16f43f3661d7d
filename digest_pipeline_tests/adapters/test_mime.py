from digest_pipeline.adapters.mime import to_bytes
from digest_pipeline.domain.model import Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline_tests.conftest import W42

KEY = OperationKey(W42, "customer-0001")
LONG_URL = "https://shop.example/unsubscribe/customer-0001?token=" + "e" * 64


def test_a_long_unsubscribe_url_stays_literal_on_the_wire():
    message = Message(
        KEY,
        "a@example.test",
        "digest@example.com",
        "Subject",
        "text",
        headers=(("List-Unsubscribe", f"<{LONG_URL}>"),),
    )
    assert f"List-Unsubscribe: <{LONG_URL}>\r\n".encode() in to_bytes(message)
