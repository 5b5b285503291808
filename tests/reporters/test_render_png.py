"""save_png writes the PNG from the Agg canvas itself (``pixels.write_png``): the pixels the figure
draws, as RGB since the picture is opaque, at the size asked for."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import phasemem
from helpers.paths import ROOT

FIXTURES = ROOT / "fixtures"


@pytest.mark.parametrize("name,options", [("gpt_foreach", {}), ("resnet_sgd", {"size": (700, 420), "dpi": 150})])
def test_png_is_the_canvas_pixels_as_rgb(tmp_path, name, options):
    report = phasemem.analyze(FIXTURES / f"{name}.pkl.xz")
    out = tmp_path / "memory.png"
    report.save_png(out, **options)
    fig = report.plot(**options)
    fig.canvas.draw()
    drawn = np.asarray(fig.canvas.buffer_rgba())
    assert (drawn[..., 3] == 255).all()  # opaque: nothing is lost by leaving alpha out
    with Image.open(out) as im:
        assert im.mode == "RGB"
        assert np.array_equal(np.asarray(im), drawn[..., :3])
