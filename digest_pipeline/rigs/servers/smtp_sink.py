"""Postfix's `smtp-sink` on a free loopback port, with the faults its options script, for tests.

`smtp-sink` (Debian's `postfix` package; scripts/debian-test-tools.sh installs it, and the
postfix service is never configured nor started) is an SMTP server nobody here wrote: a test
against it checks the SMTP mailer against an independent peer's replies rather than against our
own aiosmtpd script. Every message it accepts is dumped to a file of its own (`-d`), so a test
can count what arrived. Run as root, it must drop privileges (`-u`): it runs as `nobody`,
chrooted (`-R`) into its dump folder.
"""

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from digest_pipeline.rigs.servers.loopback import free_port as _free_port

#: where Debian's postfix installs it (off a user's PATH)
SMTP_SINK = Path("/usr/sbin/smtp-sink")
#: the unprivileged user smtp-sink switches to when started as root
RUN_AS = "nobody"
START_TIMEOUT_SECONDS = 10.0
_DUMP_PREFIX = "msg."


def find_smtp_sink() -> Path | None:
    """The `smtp-sink` binary: Debian's path, else on PATH; None when postfix is not installed."""
    if SMTP_SINK.is_file() and os.access(SMTP_SINK, os.X_OK):
        return SMTP_SINK
    found = shutil.which("smtp-sink")
    return Path(found) if found else None


@dataclass(frozen=True)
class SinkFaults:
    """smtp-sink's fault options (`man smtp-sink`); the default is a sink that accepts all.

    Commands are named as the manual names them: `CONNECT`, `EHLO`, `MAIL`, `RCPT`, `DATA`, and
    `.` for the end of the message data.
    """

    #: `-r`: refuse these commands with `soft_reply` (default "450 4.3.0 Error: command failed")
    soft_reject: tuple[str, ...] = ()
    #: `-b`: the whole soft reply line, e.g. "452 4.5.3 Error: too many recipients"
    soft_reply: str | None = None
    #: `-f`: refuse these commands with `hard_reply` (default "500 5.3.0 Error: command failed")
    hard_reject: tuple[str, ...] = ()
    #: `-B`: the whole hard reply line, e.g. "550 5.1.1 Error: user unknown"
    hard_reply: str | None = None
    #: `-q`: hang up, with no reply, after receiving these commands
    hang_up: tuple[str, ...] = ()
    #: `-Q`: reply 421 and hang up after receiving these commands
    closing: tuple[str, ...] = ()
    #: `-W command:seconds`: wait this long (whole seconds) before replying to the command
    delays: tuple[tuple[str, int], ...] = ()
    #: `-8` when False: EHLO does not offer 8BITMIME
    eight_bit: bool = True

    def argv(self) -> list[str]:
        """The options that set these faults."""
        args: list[str] = []
        for flag, commands in (
            ("-r", self.soft_reject),
            ("-f", self.hard_reject),
            ("-q", self.hang_up),
            ("-Q", self.closing),
        ):
            if commands:
                args += [flag, ",".join(commands)]
        if self.soft_reply is not None:
            args += ["-b", self.soft_reply]
        if self.hard_reply is not None:
            args += ["-B", self.hard_reply]
        for command, seconds in self.delays:
            args += ["-W", f"{command}:{seconds}"]
        return args if self.eight_bit else [*args, "-8"]

    def refuses_greeting(self) -> bool:
        """True when the fault falls on the connection itself, so no normal greeting comes."""
        lists = (self.soft_reject, self.hard_reject, self.hang_up, self.closing)
        return any(c.upper() == "CONNECT" for commands in lists for c in commands) or any(
            c.upper() == "CONNECT" for c, _ in self.delays
        )


@dataclass(frozen=True)
class SinkMessage:
    """One message smtp-sink dumped: its envelope as smtp-sink recorded it, and the message."""

    mail_args: str
    rcpt_args: tuple[str, ...]
    #: header and body as received, dot-unstuffed, lines ending in LF (as smtp-sink writes them)
    raw: bytes


def parse_dump(dump: bytes) -> SinkMessage:
    """The message in a `-d` dump file, and the envelope smtp-sink recorded.

    A dump is smtp-sink's X-* records and 3-line Received header, the message, and an empty line
    it appends (manual, "DUMP FILE FORMAT").
    """
    lines = dump.split(b"\n")
    mail_args, rcpts, at = "", [], 0
    while at < len(lines) and not lines[at].startswith(b"Received: "):
        name, _, value = lines[at].partition(b": ")
        if name == b"X-Mail-Args":
            mail_args = value.decode("utf-8", "replace")
        elif name == b"X-Rcpt-Args":
            rcpts.append(value.decode("utf-8", "replace"))
        at += 1
    at += 1  # the Received line, then its folded continuation lines
    while at < len(lines) and lines[at][:1] in (b"\t", b" "):
        at += 1
    body = b"\n".join(lines[at:])
    if not body.endswith(b"\n\n"):
        raise ValueError("not a complete smtp-sink dump (no closing empty line)")
    return SinkMessage(mail_args, tuple(rcpts), body[:-1])


class SmtpSink:
    """`smtp-sink` on 127.0.0.1 in a child process; use it as a context manager."""

    host = "127.0.0.1"

    def __init__(self, faults: SinkFaults = SinkFaults(), *, binary: Path | None = None) -> None:
        found = binary or find_smtp_sink()
        if found is None:
            raise FileNotFoundError("smtp-sink is not installed (Debian's postfix package)")
        self._binary, self.faults = found, faults
        self._token = f"sink-{secrets.token_hex(4)}"  # our greeting, told apart from a stranger's
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self.port = 0

    @property
    def dump_dir(self) -> Path:
        assert self._dir is not None, "not started"
        return self._dir / "dump"

    def messages(self) -> list[SinkMessage]:
        """Every message dumped so far, oldest first.

        smtp-sink opens a transaction's file at MAIL; one that ended before DATA leaves it
        empty, and that is no message.
        """
        files = sorted(self.dump_dir.glob(f"{_DUMP_PREFIX}*"), key=lambda p: p.stat().st_mtime_ns)
        dumped = (path.read_bytes() for path in files)
        return [parse_dump(dump) for dump in dumped if dump]

    def __enter__(self) -> "SmtpSink":
        self._dir = Path(tempfile.mkdtemp(prefix="digest-smtp-sink-"))
        try:
            self.dump_dir.mkdir(mode=0o700)
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def stop(self) -> None:
        """Stops the process (SIGTERM, then SIGKILL); the dumps stay until the context ends."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _argv(self, port: int) -> list[str]:
        args = [str(self._binary), "-h", self._token, *self.faults.argv()]
        if os.geteuid() == 0:  # smtp-sink refuses to run as root without -u
            user = pwd.getpwnam(RUN_AS)
            os.chown(self.dump_dir, user.pw_uid, user.pw_gid)
            args += ["-u", RUN_AS, "-R", str(self.dump_dir), "-d", f"/{_DUMP_PREFIX}"]
        else:
            args += ["-d", f"{self.dump_dir}/{_DUMP_PREFIX}"]
        return [*args, f"{self.host}:{port}", "16"]

    def _start(self) -> None:
        assert self._dir is not None
        log = self._dir / "stderr.log"
        for _ in range(3):  # another process may take the free port before smtp-sink binds it
            self.port = _free_port()
            with log.open("wb") as err:
                self._proc = subprocess.Popen(
                    self._argv(self.port), stdin=subprocess.DEVNULL, stdout=err, stderr=err
                )
            if self._wait_until_listening():
                return
            self.stop()
            said = log.read_text(encoding="utf-8", errors="replace").strip()
            if "in use" not in said:
                raise RuntimeError(f"smtp-sink did not start: {said or 'no output'}")
        raise RuntimeError("smtp-sink found no free port in 3 tries")

    def _wait_until_listening(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=2) as s,
            ):
                if self.faults.refuses_greeting():
                    return self._proc.poll() is None
                if self._token.encode() in s.recv(512):
                    s.sendall(b"QUIT\r\n")
                    return True
            time.sleep(0.05)
        return False
