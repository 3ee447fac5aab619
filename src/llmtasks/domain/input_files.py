"""Images and documents a task names by file id (uploaded with POST /v1/files or /v1/uploads,
purpose `user_data` or `vision`): what may be named, the bytes a task may name in all, what a
file is (its type sniffed from its first bytes, a PDF's pages counted), and the request the
provider gets with each id replaced by the file's bytes as a data URL.

The replacement happens in the worker's memory for one call: the stored task keeps the ids, so
no item, message or payload ever carries the bytes.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass

from llmtasks.domain.llm_request import ContentPart, FilePart, ImagePart, LLMRequest

# OpenAI's purpose for a model's inputs, and its older one for images.
INPUT_PURPOSES = frozenset({"user_data", "vision"})
# A file of those purposes, and every file one task names together, hold at most this many
# bytes (OpenAI's file inputs: 50 MB a request).
MAX_TASK_FILE_BYTES = 50_000_000
# OpenAI reads at most this many pages of the PDFs of one request (file inputs guide: "up to 100
# pages ... in a single request"): the bound of a PDF whose pages cannot be counted.
MAX_PDF_PAGES = 100
INPUT_FILE_MISSING = "input_file_missing"

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
# A page object's type (`/Type /Page`, not the page tree's `/Pages`), as it appears in the file.
_PAGE = re.compile(rb"/Type\s{0,8}/Page(?![A-Za-z0-9])")
# The longest match, kept from one chunk to the next so none is cut in two.
_CARRY = 32


def sniff_mime(head: bytes) -> str | None:
    """The media type that a file's first bytes say it is (PNG, JPEG, GIF, WebP, PDF), or None."""
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if b"%PDF-" in head[:1024]:  # a PDF may have bytes before its header
        return "application/pdf"
    return None


class PageCounter:
    """Counts a PDF's page objects as its bytes stream past, a chunk at a time (an upload is
    joined so, never whole in memory). Pages kept in compressed object streams (/ObjStm) are not
    seen: such a file's count is None, and its bound is MAX_PDF_PAGES."""

    def __init__(self) -> None:
        self._carry = b""
        self._count = 0
        self._hidden = False

    def feed(self, chunk: bytes) -> None:
        buffer = self._carry + chunk
        carried = len(self._carry)
        # A match is counted once its next byte is known (it must not be an `s`), in the chunk
        # where that byte arrives; the carry holds the rest for the next chunk.
        self._count += sum(1 for match in _PAGE.finditer(buffer) if carried <= match.end() < len(buffer))
        self._hidden = self._hidden or b"/ObjStm" in buffer
        self._carry = buffer[-_CARRY:]

    @property
    def pages(self) -> int | None:
        """The pages counted, or None when they may be hidden in object streams (or none were seen)."""
        end = sum(1 for match in _PAGE.finditer(self._carry) if match.end() == len(self._carry))
        count = self._count + end
        return None if self._hidden or count == 0 else count


def pdf_pages(data: bytes) -> int | None:
    """A PDF's pages, counted by its page objects; None when they cannot be counted so."""
    counter = PageCounter()
    counter.feed(data)
    return counter.pages


@dataclass(frozen=True)
class FileFacts:
    """What the cost bound needs of one input file: its size, and for a PDF its pages (None: a
    PDF not counted, bound at MAX_PDF_PAGES). `pdf` False for any other file."""

    size: int
    pdf: bool
    pages: int | None = None

    @property
    def page_bound(self) -> int:
        return min(self.pages or MAX_PDF_PAGES, MAX_PDF_PAGES) if self.pdf else 0


def facts_of(size: int, pages: int | None, head: Callable[[], bytes]) -> FileFacts:
    """A stored file's facts: whether it is a PDF is what its first bytes (`head`, read only
    when its pages were not counted) say, as the worker sends it so, whatever its upload claimed."""
    pdf = pages is not None or sniff_mime(head()) == "application/pdf"
    return FileFacts(size=size, pdf=pdf, pages=pages)


# A file no look has sized (the bound must still hold): the most a task may name.
UNKNOWN_FILE = FileFacts(size=MAX_TASK_FILE_BYTES, pdf=True)


@dataclass(frozen=True)
class InputFile:
    """A file's bytes as the worker read them, with what the upload said of it."""

    data: bytes
    filename: str
    mime_type: str | None = None


class InputFileMissing(Exception):
    """A file the task names is gone (expired, deleted) when the task runs."""

    def __init__(self, file_id: str) -> None:
        super().__init__(
            f"The file '{file_id}' the task names no longer exists (expired or deleted): upload it again."
        )
        self.file_id = file_id


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def with_file_data(request: LLMRequest, read: Callable[[str], InputFile | None]) -> LLMRequest:
    """`request` with each file id replaced by its file's bytes: an image part gets a data URL
    (its type from the upload, else from its first bytes), a file part `file_data` and its
    filename. `read` gives a file by id (None: gone, InputFileMissing). A request naming no
    file is returned as it is."""
    ids = request.file_ids()
    if not ids:
        return request
    files: dict[str, InputFile] = {}
    for file_id in ids:
        found = read(file_id)
        if found is None:
            raise InputFileMissing(file_id)
        files[file_id] = found
    messages = [
        message.model_copy(update={"content": [_with_data(part, files) for part in message.content]})
        if isinstance(message.content, list)
        else message
        for message in request.messages or []
    ]
    return request.model_copy(update={"messages": messages})


def _with_data(part: ContentPart, files: dict[str, InputFile]) -> ContentPart:
    """One part with the file it names as data (any other part as it is)."""
    if isinstance(part, ImagePart) and part.image_url.file_id is not None:
        file = files[part.image_url.file_id]
        mime = file.mime_type if (file.mime_type or "").startswith("image/") else None
        url = _data_url(mime or sniff_mime(file.data[:16]) or "image/png", file.data)
        image = part.image_url.model_copy(update={"url": url, "file_id": None})
        return part.model_copy(update={"image_url": image})
    if isinstance(part, FilePart) and part.file.file_id is not None:
        file = files[part.file.file_id]
        mime = sniff_mime(file.data[:1024]) or file.mime_type or "application/pdf"
        ref = part.file.model_copy(
            update={
                "file_data": _data_url(mime, file.data),
                "file_id": None,
                "filename": part.file.filename or file.filename,
            }
        )
        return part.model_copy(update={"file": ref})
    return part
