"""Documents for tests and the bench to send, made here: nothing downloads at run time."""

from __future__ import annotations


def pdf_document(text: str, *, pages: int = 1, size: int = 0) -> bytes:
    """A valid PDF of `pages` pages, the first showing `text`, padded to about `size` bytes with
    comment lines in its first page's content stream (a large document with no download)."""
    content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET\n".encode()
    filler = b"% " + b"x" * 76 + b"\n"
    content += filler * max(0, (size - 600 * pages) // len(filler))
    kids = " ".join(f"{3 + 2 * n} 0 R" for n in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
    ]
    for n in range(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * n} 0 R >>".encode()
        )
        stream = content if n == 0 else b"BT ET\n"
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"endstream")
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out
