"""augment_batch / normalize_batch: shapes, determinism from the generator, crop and flip semantics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_node.data import augment_batch, normalize_batch
from edge_node.data.augment import crop_flip

MEAN = (0.49, 0.48, 0.45)
STD = (0.25, 0.24, 0.26)


def _batch(b: int = 16, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)  # no zeros: padding stands out


def test_normalize_matches_the_formula() -> None:
    x = _batch()
    out = normalize_batch(x, MEAN, STD)
    assert out.dtype == torch.float32 and out.shape == x.shape
    expected = (x.double() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-5)


def test_augment_shapes_dtype_and_determinism() -> None:
    x = _batch(64)
    a = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(1))
    b = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(1))
    c = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(2))
    assert a.dtype == torch.float32 and a.shape == (64, 3, 32, 32)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(x, _batch(64)), "the input batch was modified"


def test_centre_crop_without_flip_reproduces_the_input() -> None:
    x = _batch(8)
    pad = torch.full((8,), 4)
    out = crop_flip(x, pad, pad, torch.zeros(8, dtype=torch.bool), 4)
    assert torch.equal(out, x)
    flipped = crop_flip(x, pad, pad, torch.ones(8, dtype=torch.bool), 4)
    assert torch.equal(flipped, x.flip(-1))


def test_corner_crop_shifts_and_zero_pads() -> None:
    x = _batch(4)
    zero = torch.zeros(4, dtype=torch.long)
    out = crop_flip(x, zero, zero, torch.zeros(4, dtype=torch.bool), 4)  # top-left corner of the padded image
    assert torch.equal(out[:, :, 4:, 4:], x[:, :, :-4, :-4])
    assert (out[:, :, :4, :] == 0).all() and (out[:, :, :, :4] == 0).all()
    # Per-sample offsets: sample 1 shifted right by 2 only.
    top = torch.tensor([4, 4, 4, 4])
    left = torch.tensor([4, 6, 4, 4])
    out = crop_flip(x, top, left, torch.zeros(4, dtype=torch.bool), 4)
    assert torch.equal(out[0], x[0])
    assert torch.equal(out[1, :, :, :-2], x[1, :, :, 2:]) and (out[1, :, :, -2:] == 0).all()


def test_every_augmented_sample_is_a_padded_crop_possibly_flipped() -> None:
    x = _batch(32, seed=3)
    out = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(5))
    keys = [(top, left, flip) for top in range(9) for left in range(9) for flip in (False, True)]
    candidates = torch.stack(
        [normalize_batch(crop_flip(x, torch.full((32,), t), torch.full((32,), lft), torch.full((32,), f), 4),
                         MEAN, STD) for t, lft, f in keys]
    )  # [162, B, 3, H, W]  # fmt: skip
    match = (candidates == out.unsqueeze(0)).flatten(2).all(dim=2)  # [162, B]
    assert match.any(dim=0).all(), f"samples {torch.nonzero(~match.any(dim=0)).flatten().tolist()} are no crops"
    seen = {keys[int(k)] for k in match.int().argmax(dim=0)}
    assert len({k[:2] for k in seen}) > 12, "crop offsets do not vary"
    assert {k[2] for k in seen} == {False, True}, "flip never / always happens"
    padded_value = (0 - torch.tensor(MEAN)) / torch.tensor(STD)  # zero pixels, normalised
    corner = candidates[keys.index((0, 0, False)), 0, :, 0, 0]
    torch.testing.assert_close(corner, padded_value)


def test_no_crop_no_flip_is_plain_normalisation() -> None:
    x = _batch(8)
    out = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(0), crop_padding=0, flip=False)
    assert torch.equal(out, normalize_batch(x, MEAN, STD))


def test_other_image_sizes_work() -> None:
    x = _batch(5, 64, 48)
    out = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(0))
    assert out.shape == (5, 3, 64, 48)


def test_bad_inputs_are_refused() -> None:
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="uint8"):
        augment_batch(torch.zeros(2, 3, 8, 8), MEAN, STD, g)
    with pytest.raises(ValueError, match="one value per channel"):
        normalize_batch(_batch(2), (0.5, 0.5), STD)
    with pytest.raises(ValueError, match="crop_padding"):
        augment_batch(_batch(2), MEAN, STD, g, crop_padding=-1)


@pytest.mark.parametrize("n, batch_size", [(2500, 128), (300, 7), (50, 2000)])
def test_training_batches_augmented_in_chunks_equal_batch_by_batch(monkeypatch, n: int, batch_size: int) -> None:
    """Chunks of AUGMENT_SAMPLES (the default) give bitwise the batches of augmenting each batch alone."""
    from edge_node.data import batches as batches_module
    from edge_node.data.batches import ClientData, ImagePool

    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (n + 40, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n + 40,), generator=g)
    pool = ImagePool(images, labels, images[:5], labels[:5], (0.49, 0.48, 0.45), (0.25, 0.24, 0.26), 10)
    client = ClientData.from_indices(pool, np.arange(20, 20 + n), np.arange(5))

    def epochs_of_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(client.train_batches(2, torch.Generator().manual_seed(7), batch_size))

    chunked = epochs_of_batches()
    monkeypatch.setattr(batches_module, "AUGMENT_SAMPLES", 1)  # one batch at a time, as before
    alone = epochs_of_batches()
    assert len(chunked) == len(alone) == 2 * -(-n // batch_size)
    for (xc, yc), (xa, ya) in zip(chunked, alone, strict=True):
        assert xc.dtype == torch.float32 and torch.equal(xc, xa) and torch.equal(yc, ya)
