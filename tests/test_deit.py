"""DeiT: parameter formula, timm weight equivalence, the two heads, distillation losses, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitlab
from conftest import assert_same_logits, count_on_meta, load_reference, random_images, timm_model
from vitlab.distill import DistillationLoss, SmallCNNTeacher, hard_distillation_loss, soft_distillation_loss

DEIT_NAMES = [
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_tiny_distilled_patch16_224",
    "deit_small_distilled_patch16_224",
    "deit_base_distilled_patch16_224",
]

# A small distilled DeiT for the fast tests: 8x8 grey images, 2x2 patches -> 16 + 2 tokens.
SMALL = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=4)


def small_deit(distilled: bool = True, **overrides) -> torch.nn.Module:
    name = "deit_tiny_distilled_patch16_224" if distilled else "deit_tiny_patch16_224"
    return vitlab.create_model(name, **{**SMALL, **overrides})


@pytest.mark.parametrize("D, L", [(192, 12), (384, 12), (768, 12)])
def test_parameter_count_matches_formula(D: int, L: int) -> None:
    # book/reference_numbers.md: 3p^2 D + D + D t + (196 + t) D + L(12 D^2 + 13 D) + 2D + t(1000 D + 1000).
    def formula(t: int) -> int:
        return 3 * 16 * 16 * D + D + D * t + (196 + t) * D + L * (12 * D * D + 13 * D) + 2 * D + t * (1000 * D + 1000)

    size = {192: "tiny", 384: "small", 768: "base"}[D]
    assert formula(1) == count_on_meta(f"deit_{size}_patch16_224")
    assert formula(2) == count_on_meta(f"deit_{size}_distilled_patch16_224")


# One reference run: the distilled model (dist token, head_dist), depth cut to 2, every
# weight perturbed; the plain DeiTs are ViTs (tests/test_vit.py). That every preset's
# state dict maps onto timm's, key by key and shape by shape: tests/test_contract.py.
def test_timm_weights_give_same_logits() -> None:
    name = "deit_tiny_distilled_patch16_224"
    reference = timm_model(name, depth=2)
    model = load_reference(name, reference, depth=2)
    images = random_images(2)
    assert_same_logits(model, reference, images)  # eval mode: the mean of the two heads, as timm
    with torch.no_grad():
        assert model(images).std() > 0  # random heads, so the comparison is not trivially 0 == 0


def test_convert_timm_checks_the_distillation_token() -> None:
    state_dict = vitlab.create_model("deit_tiny_distilled_patch16_224").state_dict()
    with pytest.raises(ValueError, match=r"config has distilled=False but the state dict has 'dist_token'"):
        vitlab.convert_state_dict("deit_tiny_patch16_224", state_dict)


def test_token_and_position_embedding_shapes() -> None:
    plain = vitlab.create_model("deit_tiny_patch16_224")
    distilled = vitlab.create_model("deit_tiny_distilled_patch16_224")
    assert plain.dist_token is None and plain.head_dist is None
    assert plain.pos_embed.shape == (1, 197, 192) and distilled.pos_embed.shape == (1, 198, 192)
    images = random_images(1)
    assert plain.embed(images).shape == (1, 197, 192)
    assert distilled.embed(images).shape == (1, 198, 192)
    maps = [record.attn for record in vitlab.attention_maps(distilled, images)]
    assert len(maps) == 12 and maps[0].shape == (1, 3, 198, 198)  # (B, h, 2 + N, 2 + N)
    torch.testing.assert_close(maps[-1].sum(-1), torch.ones(1, 3, 198))


def test_training_returns_both_heads_and_eval_their_mean() -> None:
    model = small_deit()
    images = random_images(4, 8, channels=1)
    cls_logits, dist_logits = model.train()(images)  # no dropout: train and eval compute the same
    assert cls_logits.shape == dist_logits.shape == (4, 10)
    with torch.no_grad():
        mean = model.eval()(images)
    torch.testing.assert_close(mean, (cls_logits + dist_logits).detach() / 2)
    assert not torch.allclose(cls_logits, dist_logits)  # two different heads on two different tokens


def test_plain_model_returns_one_tensor_in_training() -> None:
    model = small_deit(distilled=False).train()
    assert isinstance(model(random_images(2, 8, channels=1)), torch.Tensor)


def test_train_mode_with_dropout_and_drop_path_backprops() -> None:
    model = small_deit(drop_rate=0.1, drop_path_rate=0.1).train()
    images, labels = random_images(4, 8, channels=1), torch.tensor([0, 1, 2, 3])
    teacher_logits = torch.randn(4, 10)
    loss = hard_distillation_loss(*model(images), teacher_logits, labels)
    loss.backward()
    assert model.dist_token.grad is not None and model.head_dist.weight.grad is not None


# ---------------------------------------------------------------- losses


def _logits(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    cls, dist, teacher = (torch.randn(6, 5, generator=g) * 2 for _ in range(3))
    labels = torch.randint(0, 5, (6,), generator=g)
    return cls, dist, teacher, labels


def _cross_entropy_by_hand(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    log_probs = logits - logits.exp().sum(-1, keepdim=True).log()
    return -log_probs[torch.arange(len(targets)), targets].mean()


@pytest.mark.parametrize("alpha, tau", [(0.5, 3.0), (0.1, 1.0), (0.9, 10.0)])
def test_soft_distillation_matches_hand_written_formula(alpha: float, tau: float) -> None:
    cls, dist, teacher, labels = _logits()
    p_t = (teacher / tau).softmax(-1)
    p_s = (dist / tau).softmax(-1)
    kl = (p_t * (p_t.log() - p_s.log())).sum()  # summed over batch and classes
    expected = (1 - alpha) * _cross_entropy_by_hand(cls, labels) + alpha * kl * tau**2 / dist.numel()
    got = soft_distillation_loss(cls, dist, teacher, labels, alpha=alpha, tau=tau)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_hard_distillation_matches_hand_written_formula(alpha: float) -> None:
    cls, dist, teacher, labels = _logits()
    teacher_labels = teacher.argmax(-1)
    expected = (1 - alpha) * _cross_entropy_by_hand(cls, labels) + alpha * _cross_entropy_by_hand(dist, teacher_labels)
    torch.testing.assert_close(hard_distillation_loss(cls, dist, teacher, labels, alpha=alpha), expected)


def test_errata_7_wrong_hard_target_differs_from_the_right_one() -> None:
    model = small_deit().train()
    images, labels = random_images(6, 8, channels=1), torch.tensor([0, 1, 2, 3, 4, 5])
    teacher_logits = torch.randn(6, 10, generator=torch.Generator().manual_seed(1))
    cls_logits, dist_logits = model(images)
    right = hard_distillation_loss(cls_logits, dist_logits, teacher_logits, labels)
    # Pitfall 9 (the token-free variant): CE of the *cls* head on the teacher's labels; the dist head is unused.
    wrong = 0.5 * F.cross_entropy(cls_logits, labels) + 0.5 * F.cross_entropy(cls_logits, teacher_logits.argmax(-1))
    assert abs(right.item() - wrong.item()) > 1e-3
    wrong.backward()
    assert model.head_dist.weight.grad is None  # the wrong loss never trains the distillation head


def test_losses_ignore_teacher_gradients() -> None:
    cls, dist, teacher, labels = _logits()
    for t in (cls, dist, teacher):
        t.requires_grad_(True)
    for loss in (soft_distillation_loss, hard_distillation_loss):
        loss(cls, dist, teacher, labels).backward()
        assert teacher.grad is None and dist.grad is not None


def test_distillation_loss_module_runs_the_teacher() -> None:
    teacher = SmallCNNTeacher(in_chans=1, num_classes=10).eval()
    model = small_deit().train()
    images, labels = random_images(4, 8, channels=1), torch.tensor([0, 1, 2, 3])
    outputs = model(images)
    with torch.no_grad():
        teacher_logits = teacher(images)
    for kind, fn in (("hard", hard_distillation_loss), ("soft", soft_distillation_loss)):
        got = DistillationLoss(teacher, distillation_type=kind)(images, outputs, labels)
        torch.testing.assert_close(got, fn(*outputs, teacher_logits, labels))
    none = DistillationLoss(teacher, distillation_type="none")
    torch.testing.assert_close(none(images, outputs, labels), F.cross_entropy(outputs[0], labels))


def test_distillation_loss_rejects_a_student_without_distillation_head() -> None:
    teacher = SmallCNNTeacher().eval()
    student = small_deit(distilled=False).train()
    images, labels = random_images(2, 8, channels=1), torch.tensor([0, 1])
    criterion = DistillationLoss(teacher, distillation_type="hard")
    message = r"needs a student with a distillation head .* single logits tensor of shape \(2, 10\)"
    with pytest.raises(ValueError, match=message):
        criterion(images, student(images), labels)
    with pytest.raises(TypeError, match=r"a \(cls_logits, dist_logits\) pair, got tuple of length 3"):
        criterion(images, (torch.zeros(2, 10),) * 3, labels)


def test_distillation_loss_rejects_a_teacher_in_training_mode() -> None:
    criterion = DistillationLoss(SmallCNNTeacher().train())
    outputs = (torch.zeros(2, 10), torch.zeros(2, 10))
    with pytest.raises(ValueError, match=r"teacher is in training mode"):
        criterion(random_images(2, 8, channels=1), outputs, torch.tensor([0, 1]))


def test_distillation_loss_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"distillation_type must be one of .*got 'kl'"):
        DistillationLoss(SmallCNNTeacher(), distillation_type="kl")
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        DistillationLoss(SmallCNNTeacher(), alpha=1.5)


def test_loss_logit_shape_mismatch() -> None:
    cls, dist, teacher, labels = _logits()
    with pytest.raises(ValueError, match=r"same shape .*\(6, 5\), \(6, 4\) and \(6, 5\)"):
        hard_distillation_loss(cls, dist[:, :4], teacher, labels)


def test_small_cnn_teacher_shapes_and_bad_input() -> None:
    teacher = SmallCNNTeacher(in_chans=1, num_classes=10)
    assert teacher(random_images(3, 8, channels=1)).shape == (3, 10)
    assert teacher(random_images(2, 32, channels=1)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, H, W\), got \(2, 3, 8, 8\)"):
        teacher(random_images(2, 8, channels=3))


# ---------------------------------------------------------------- bad input


def test_image_not_divisible_by_patch_size() -> None:
    with pytest.raises(ValueError, match=r"img_size 225 is not divisible by patch_size 16"):
        vitlab.create_model("deit_tiny_distilled_patch16_224", img_size=225)


def test_embed_dim_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"embed dim 200 is not divisible by num_heads 3"):
        vitlab.create_model("deit_tiny_distilled_patch16_224", embed_dim=200)


def test_input_size_not_divisible_by_patch() -> None:
    model = small_deit()
    with pytest.raises(ValueError, match=r"image size 9x9 is not divisible by the patch size 2x2"):
        model(random_images(1, 9, channels=1))


def test_list_models_has_the_deit_presets() -> None:
    assert set(DEIT_NAMES) <= set(vitlab.list_models("deit_"))
