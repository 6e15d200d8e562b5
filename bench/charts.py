"""PNG charts for the benchmarks without a plotting package (zlib only).

Every benchmark saves a picture beside its JSON; matplotlib is not a dependency, so the charts are
drawn here on an RGB canvas with a 3x5 pixel font (upper case, digits, a little punctuation):

- `Canvas(width, height)`: `rect`, `text`, `save(path)`;
- `bar_chart(path, title, groups, series, reference=None)`: grouped bars, one colour per series,
  a legend, group labels under the bars and an optional horizontal reference line (e.g. 1.0x).
"""

from __future__ import annotations

import struct
import zlib

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "111100100100111", "D": "110101101101110", "E": "111100111100111", "F": "111100111100100",
    "G": "111100101101111", "H": "101101111101101", "I": "111010010010111", "J": "001001001101111",
    "K": "101110100110101", "L": "100100100100111", "M": "101111111101101", "N": "101111111111101",
    "O": "111101101101111", "P": "111101111100100", "Q": "111101101111001", "R": "110101110101101",
    "S": "111100111001111", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101101111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    "=": "000111000111000", " ": "000000000000000", "/": "001001010100100", ".": "000000000000010",
    "-": "000000111000000", "+": "000010111010000", ":": "000010000010000", "_": "000000000000111",
    ",": "000000000010100", "(": "010100100100010", ")": "010001001001010", "%": "101001010100101",
}
PALETTE = [(40, 90, 200), (220, 120, 30), (60, 160, 70), (170, 60, 160), (150, 150, 150), (200, 50, 50)]
BLACK, GREY, WHITE = (0, 0, 0), (220, 220, 220), (255, 255, 255)


class Canvas:
    """An RGB image as rows of (r, g, b) tuples; (0, 0) is the top-left corner."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.img = [[WHITE] * width for _ in range(height)]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the canvas."""
        for y in range(max(0, y0), min(self.height, y1)):
            row = self.img[y]
            for x in range(max(0, x0), min(self.width, x1)):
                row[x] = color

    def text(self, x: int, y: int, s: str, color=BLACK, scale: int = 2) -> int:
        """Draw `s` (upper-cased; unknown characters as blanks) from (x, y); returns the end x."""
        for ch in s.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for i, bit in enumerate(glyph):
                if bit == "1":
                    r, c = divmod(i, 3)
                    self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, color)
            x += 4 * scale
        return x

    def save(self, path: str) -> None:
        raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in self.img)

        def chunk(tag, data):
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0))
               + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
        with open(path, "wb") as f:
            f.write(png)


def bar_chart(path: str, title: str, groups: list[str], series: dict[str, list[float]],
              reference: float | None = None, panel_h: int = 220, label_chars: int = 0) -> None:
    """Grouped bars: for each group label, one bar per series (linear scale from 0 to the largest
    value), a legend above, and a grey line at `reference` when given. Values are drawn as given; the
    JSON beside the picture holds the exact numbers. Labels are cut to the group's width, which is
    widened to hold `label_chars` characters."""
    names = list(series)
    per_group = max(1, len(names))
    bar_w, gap = 14, 24
    group_w = max(per_group * bar_w + gap, 8 * label_chars + 8)
    width = max(60 + group_w * len(groups), 40 + 9 * len(title), 200)
    legend_h = 14 * len(names)
    top = 30 + legend_h
    height = top + panel_h + 40
    canvas = Canvas(width, height)
    canvas.text(10, 8, title)
    for i, name in enumerate(names):
        y = 26 + 14 * i
        canvas.rect(10, y, 20, y + 10, PALETTE[i % len(PALETTE)])
        canvas.text(26, y, name)
    values = [v for vs in series.values() for v in vs if v == v] + ([reference] if reference else [])
    hi = max(values, default=1.0) or 1.0
    base = top + panel_h

    def y_of(v: float) -> int:
        return base - int(max(v, 0.0) / hi * (panel_h - 10))

    if reference is not None:
        canvas.rect(40, y_of(reference), width - 10, y_of(reference) + 1, GREY)
        canvas.text(4, y_of(reference) - 5, f"{reference:g}")
    canvas.rect(40, base, width - 10, base + 1, BLACK)
    canvas.text(4, y_of(hi) - 5, f"{hi:.3g}")
    for g, label in enumerate(groups):
        x = 50 + g * group_w
        for j, name in enumerate(names):
            v = series[name][g]
            if v == v:  # NaN: no bar
                canvas.rect(x + j * bar_w, y_of(v), x + (j + 1) * bar_w - 2, base, PALETTE[j % len(PALETTE)])
        canvas.text(x, base + 6, label[: max(1, group_w // 8)])
    canvas.save(path)
