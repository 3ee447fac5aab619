"""Content parts of a user message: text, an image, a document (a PDF).

A small image or file is put inline as a base64 data URL. One over the inline limit would push
the request past the API's cap on a task's text and inline data (MAX_PROMPT_BYTES, 200 KiB by
default), so the helper gives a `LocalFile` instead: the client's `submit` uploads it (Files
API, purpose user_data) and sends the part with the file's id.
"""

from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# The most raw bytes a part carries inline (about 87 KB as base64): a few fit one request.
INLINE_BYTES = 64 * 1024

Detail = Literal["auto", "low", "high"]
Source = str | os.PathLike[str] | bytes

# The first bytes of the image formats the providers take.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


@dataclass(frozen=True)
class LocalFile:
    """A part too large to go inline: uploaded by `submit`, then named by its file id."""

    kind: Literal["image", "file"]
    filename: str
    media_type: str
    data: bytes | None = None  # the bytes given, or
    path: Path | None = None  # the file to read them from
    detail: Detail | None = None

    @property
    def source(self) -> Path | bytes:
        return self.path if self.path is not None else self.data or b""

    def part(self, file_id: str) -> dict[str, Any]:
        """The content part that names the uploaded file."""
        if self.kind == "image":
            image: dict[str, Any] = {"file_id": file_id}
            if self.detail is not None:
                image["detail"] = self.detail
            return {"type": "image_url", "image_url": image}
        return {"type": "file", "file": {"file_id": file_id, "filename": self.filename}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part(
    image: Source,
    *,
    detail: Detail | None = None,
    media_type: str | None = None,
    inline_limit: int = INLINE_BYTES,
) -> dict[str, Any] | LocalFile:
    """An image_url part: an http(s) or data URL as it is; a path's or bytes' image inline as a
    data URL, or, over `inline_limit` bytes, a LocalFile that submit uploads."""
    if isinstance(image, str) and image.startswith(("http://", "https://", "data:")):
        url: dict[str, Any] = {"url": image}
    else:
        given = _Given.of(image, "image")
        media = media_type or _image_type(given.head()) or mimetypes.guess_type(given.name)[0]
        if media is None or not media.startswith("image/"):
            raise ValueError(f"{given.name}: not an image of a known type (give media_type='image/...')")
        if given.size() > inline_limit:
            return LocalFile("image", given.name, media, given.data, given.path, detail)
        url = {"url": _data_url(media, given.read())}
    if detail is not None:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


def file_part(
    document: Source,
    *,
    filename: str | None = None,
    media_type: str | None = None,
    inline_limit: int = INLINE_BYTES,
) -> dict[str, Any] | LocalFile:
    """A file part (a PDF, a text file): its bytes inline as a data URL with its filename, or,
    over `inline_limit` bytes, a LocalFile that submit uploads. A str is a path."""
    given = _Given.of(document, "file")
    name = filename or given.name
    media = media_type or ("application/pdf" if given.head().startswith(b"%PDF-") else None)
    media = media or mimetypes.guess_type(name)[0] or "application/octet-stream"
    if given.size() > inline_limit:
        return LocalFile("file", name, media, given.data, given.path)
    file_data = _data_url(media, given.read())
    return {"type": "file", "file": {"file_data": file_data, "filename": name}}


def with_text_parts(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each bare string of a content list made a text part."""
    given = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [text_part(part) if isinstance(part, str) else part for part in content]
            given.append({**message, "content": content})
        else:
            given.append(dict(message))
    return given


def local_files(value: Any) -> list[LocalFile]:
    """Every LocalFile in a request body (its messages, a batch's items), in order, once each."""
    if isinstance(value, LocalFile):
        return [value]
    found: list[LocalFile] = []
    children = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else []
    for child in children:
        found.extend(file for file in local_files(child) if file not in found)
    return found


def with_file_ids(body: dict[str, Any], file_ids: Mapping[LocalFile, str]) -> dict[str, Any]:
    """The body with each LocalFile replaced by the part naming its uploaded file."""
    return dict(_with_file_ids(body, file_ids))


def _with_file_ids(value: Any, file_ids: Mapping[LocalFile, str]) -> Any:
    if isinstance(value, LocalFile):
        return value.part(file_ids[value])
    if isinstance(value, Mapping):
        return {key: _with_file_ids(child, file_ids) for key, child in value.items()}
    if isinstance(value, list):
        return [_with_file_ids(child, file_ids) for child in value]
    return value


@dataclass(frozen=True)
class _Given:
    """What a helper was given: bytes, or a file's path (read only once it goes inline)."""

    data: bytes | None
    path: Path | None
    name: str

    @classmethod
    def of(cls, source: Source, default_name: str) -> _Given:
        if isinstance(source, bytes):
            return cls(source, None, default_name)
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        return cls(None, path, path.name)

    def size(self) -> int:
        return self.path.stat().st_size if self.path is not None else len(self.data or b"")

    def head(self) -> bytes:
        if self.path is None:
            return (self.data or b"")[:16]
        with self.path.open("rb") as opened:
            return opened.read(16)

    def read(self) -> bytes:
        return self.path.read_bytes() if self.path is not None else self.data or b""


def _image_type(head: bytes) -> str | None:
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((media for magic, media in _IMAGE_MAGIC if head.startswith(magic)), None)


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"
