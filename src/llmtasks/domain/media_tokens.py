"""The most tokens a request's images and documents can be billed as, from what the providers
document, so that a budget's reservation (PriceTable.most_cost) is never below the call.

Images (OpenAI's vision guide, "Calculating costs"): a tile model scales a high-detail image to
fit 2048 x 2048, then its shortest side to 768, and bills a base plus a price per 512 px tile;
the most tiles are 2 x 4 (a 768 x 2048). gpt-4o, gpt-4.1: 85 + 170 x 8 = 1,445; o1, o3:
75 + 150 x 8 = 1,275; gpt-4o-mini: 2,833 + 5,667 x 8 = 48,169. A patch model (gpt-4.1-mini,
gpt-4.1-nano, o4-mini) bills 32 px patches, at most 1,536, times a multiplier of at most 2.46
(gpt-4.1-nano): 3,779. Claude (Anthropic's vision guide) bills width x height / 750 of an image
scaled to about 1.15 megapixels: about 1,600. So an image is bound at 3,779, or 48,169 for
gpt-4o-mini.

Documents (OpenAI's file inputs guide): a PDF is read as each page's text and an image of the
page. A page's image is an image's bound; its text is bound twice over: at PAGE_TEXT_TOKENS a
page (a dense page of small print is under 2,000 tokens; text in compressed streams is not
bounded by the file's bytes) plus one token a byte of the file (text stored uncompressed). A
PDF's pages are counted by its page objects (`/Type /Page`; no PDF library in the Lambda
layer), and bound at MAX_PDF_PAGES where they cannot be counted. Any other file is read as text:
one token a byte at most.

Audio stays counted as its base64 text (request.text_bytes): above OpenAI's rate of 1 token a
100 ms, as no audio it takes holds less than 1,000 bytes a second (mp3 at 8 kbit/s).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from llmtasks.domain.input_files import UNKNOWN_FILE, FileFacts, pdf_pages, sniff_mime
from llmtasks.domain.llm_request import FilePart, ImagePart, LLMRequest, data_url_parts

IMAGE_TOKENS = 3_779  # 1,536 patches x 2.46 (gpt-4.1-nano), above every tile model but one
IMAGE_TOKENS_4O_MINI = 48_169  # 2,833 + 5,667 x 8 tiles
PAGE_TEXT_TOKENS = 4_000


def image_tokens(model: str) -> int:
    """The most one image (or one PDF page's image) is billed as by `model`."""
    return IMAGE_TOKENS_4O_MINI if model.startswith("gpt-4o-mini") else IMAGE_TOKENS


def file_tokens(facts: FileFacts, model: str) -> int:
    """The most one file is billed as: its bytes, and for a PDF its pages' images and text."""
    return facts.size + facts.page_bound * (image_tokens(model) + PAGE_TEXT_TOKENS)


def _inline_facts(file_data: str) -> FileFacts:
    parts = data_url_parts(file_data)
    data = base64.b64decode(parts[1] if parts else file_data)
    said = parts[0] if parts else None
    pdf = "application/pdf" in (said, sniff_mime(data[:1024]))
    return FileFacts(size=len(data), pdf=pdf, pages=pdf_pages(data) if pdf else None)


def inline_media_bytes(request: LLMRequest) -> int:
    """The bytes of the images' data URLs and the documents' inline data, which text_bytes
    counts as text and media_tokens bounds instead."""
    size = 0
    for part in request.parts() if request.messages else []:
        if isinstance(part, ImagePart) and (part.image_url.url or "").startswith("data:"):
            size += len((part.image_url.url or "").encode())
        elif isinstance(part, FilePart) and part.file.file_data is not None:
            size += len(part.file.file_data.encode())
    return size


def media_tokens(request: LLMRequest, model: str, files: Mapping[str, FileFacts]) -> int:
    """The most the request's images and documents are billed as by `model`; `files` sizes those
    named by id (one it lacks is bound as the largest a task may name)."""
    tokens = 0
    for part in request.parts() if request.messages else []:
        if isinstance(part, ImagePart):
            tokens += image_tokens(model)
        elif isinstance(part, FilePart):
            if part.file.file_id is not None:
                facts = files.get(part.file.file_id, UNKNOWN_FILE)
            else:
                facts = _inline_facts(part.file.file_data or "")
            tokens += file_tokens(facts, model)
    return tokens
