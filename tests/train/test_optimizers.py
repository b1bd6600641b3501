"""Any optimizer of timm's registry by `optim.name`, built by timm's `create_optimizer_v2` on the trainer's own
parameter groups (vit/train/optimizer.py): the groups reach the optimizer unchanged, adamw and sgd are today's torch
optimizers, lion and muon train and resume exactly, and a name or keyword timm does not know is one line."""

import json

import pytest
import torch
from timm.optim import Muon, list_optimizers
from trainer_utils import (
    QUICK,
    QUICK_SYNTHETIC,
    TINY_MODEL,
    assert_evaluates_as_the_run,
    assert_resumes_exactly,
    compose_config,
    run_cli,
)

from vit.cli.evaluate import cli as evaluate_main
from vit.cli.train import train_task
from vit.errors import ConfigError
from vit.tasks.build import build_model_from_config
from vit.train import run
from vit.train.config import validate
from vit.train.optimizer import (
    build_optimizer,
    fallback_patterns,
    kept_settings_warning,
    layer_decay_groups,
    optimizer_kwargs,
    param_groups,
)
from vit.weights.read import CheckpointError

CPU = torch.device("cpu")


def tiny(*overrides: str):
    """The config and a 2-block, 32-wide ViT of it (10 classes, 32 px patches of 4)."""
    cfg = compose_config([*QUICK_SYNTHETIC, *TINY_MODEL, *overrides])
    validate(cfg)
    return cfg, build_model_from_config(cfg.model, num_classes=10)


def names_of(model, group) -> set[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for p in group["params"]}


@pytest.mark.parametrize("name", ["adamw", "lion", "muon"])
def test_a_few_steps_on_one_batch_lower_its_loss(name):
    cfg, model = tiny(f"optim={name}")
    optimizer = build_optimizer(model, cfg.optim, lr=float(cfg.optim.lr), device=CPU)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    # Every parameter moved: with Muon, its matrices and the AdamW half's head, patch kernel, tokens and norms.
    unchanged = [n for n, p in model.named_parameters() if torch.equal(before[n], p)]
    assert unchanged == []


@pytest.mark.parametrize("name", ["adamw", "lion", "muon"])
@pytest.mark.parametrize("layer_decay", [None, 0.75])
def test_the_optimizer_holds_our_groups_unchanged(name, layer_decay):
    """timm passes a list of groups through: each keeps its weight_decay (and lr_scale) and its parameters; decay
    on the weight matrices only, no frozen parameter anywhere; Muon's AdamW half flagged by `use_fallback`."""
    cfg, model = tiny(f"optim={name}", f"optim.layer_decay={layer_decay if layer_decay else 'null'}")
    for param in model.blocks[0].parameters():
        param.requires_grad = False
    optimizer = build_optimizer(model, cfg.optim, lr=1e-3, device=CPU)
    weight_decay = float(cfg.optim.weight_decay)
    fallback = fallback_patterns(model, type(optimizer))
    ours = (
        layer_decay_groups(model, weight_decay, layer_decay, fallback)
        if layer_decay
        else param_groups(model, weight_decay, fallback)
    )
    keys = ("weight_decay", "lr_scale", "use_fallback")
    assert [{k: g.get(k) for k in keys} for g in optimizer.param_groups] == [{k: g.get(k) for k in keys} for g in ours]
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == [
        [id(p) for p in g["params"]] for g in ours
    ]

    decayed, not_decayed, falls_back = set(), set(), set()
    for group in optimizer.param_groups:
        (decayed if group["weight_decay"] > 0 else not_decayed).update(names_of(model, group))
        if group.get("use_fallback"):
            falls_back |= names_of(model, group)
        assert ("lr_scale" in group) == (layer_decay is not None)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert decayed | not_decayed == set(trainable) and not decayed & not_decayed  # blocks.0.* absent
    assert not_decayed == {n for n, p in trainable.items() if p.ndim == 1} | {"pos_embed", "cls_token"}
    assert decayed == {n for n, p in trainable.items() if p.ndim >= 2} - {"pos_embed", "cls_token"}
    if name == "muon":
        assert isinstance(optimizer, Muon)
        assert falls_back == {n for n in trainable if n.startswith(("patch_embed.", "head.", "pos_embed", "cls_tok"))}
    else:
        assert falls_back == set()
    if layer_decay:
        scales = {n: g["lr_scale"] for g in optimizer.param_groups for n in names_of(model, g)}
        assert scales["head.weight"] == 1.0 and scales["pos_embed"] == pytest.approx(0.75**3)  # 2 blocks + stem


def test_adamw_and_sgd_are_todays_torch_optimizers():
    cfg, model = tiny("optim=adamw")
    adamw = build_optimizer(model, cfg.optim, lr=1e-3, device=CPU)
    assert type(adamw) is torch.optim.AdamW
    assert adamw.defaults["betas"] == (0.9, 0.999) and adamw.defaults["eps"] == 1e-8 and adamw.defaults["fused"]
    # The fused kernel (one launch for every parameter) on the CPU and on a GPU; an explicit kwargs.fused wins.
    assert optimizer_kwargs(cfg.optim, torch.optim.AdamW, torch.device("cuda")) == {"fused": True}
    cfg, _ = tiny("optim=adamw", "+optim.kwargs.fused=false", "optim.betas=[0.9,0.95]")
    assert optimizer_kwargs(cfg.optim, torch.optim.AdamW, torch.device("cuda")) == {
        "betas": (0.9, 0.95),
        "fused": False,
    }

    cfg, model = tiny("optim=sgd")
    sgd = build_optimizer(model, cfg.optim, lr=0.1, device=CPU)
    assert type(sgd) is torch.optim.SGD
    assert sgd.defaults["nesterov"] and sgd.defaults["momentum"] == 0.9
    assert [g["weight_decay"] for g in sgd.param_groups] == [5e-4, 0.0]


def test_muon_settings_reach_the_optimizer():
    cfg, model = tiny("optim=muon", "optim.kwargs.ns_steps=3", "optim.kwargs.adjust_lr_fn=rms_to_rms")
    muon = build_optimizer(model, cfg.optim, lr=1e-3, device=CPU)
    assert (muon.defaults["ns_steps"], muon.defaults["adjust_lr_fn"], muon.defaults["momentum"]) == (
        3,
        "rms_to_rms",
        0.95,
    )
    cfg, model = tiny("optim=adamw", "optim.name=nadamuon")  # any timm name with the adamw settings
    nadamuon = build_optimizer(model, cfg.optim, lr=1e-3, device=CPU)
    assert isinstance(nadamuon, Muon) and nadamuon.defaults["algo"] == "adamuon" and nadamuon.defaults["nesterov"]


@pytest.mark.parametrize(
    ("name", "closest"),
    [("lionn", "lion"), ("adamww", "adamw"), ("AdamW", "adamw"), ("foo", None)],  # timm's names are lower case
)
def test_an_unknown_name_suggests_the_closest_in_one_short_line(name, closest, capsys):
    """One line with the closest names (at most three) and where to find them all, not timm's ~100 names (a line of
    over 1,000 characters); a name close to none gets no guess."""
    with pytest.raises(ConfigError) as err:
        tiny(f"optim.name={name}")
    message = str(err.value)
    start = f"optim.name={name!r} is not an optimizer timm knows"
    listing = f" (timm.optim.list_optimizers() lists all {len(list_optimizers())})"
    assert message.startswith(start) and message.endswith(listing), message
    hint = message[len(start) : -len(listing)]
    if closest is None:
        assert hint == ""
    else:
        assert hint.startswith(f"; did you mean {closest}") and hint.endswith("?") and hint.count(",") <= 2, hint
    assert "\n" not in message and len(message) < 160
    # The command line's handler: one line on stderr, exit code 2.
    cfg = compose_config([*QUICK, f"optim.name={name}"])
    with pytest.raises(SystemExit) as exit_info:
        train_task(cfg)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"config error: {message}"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["optim=muon", "+optim.kwargs.zebra=1"],
            "optim.kwargs.zebra is not a setting of optim.name=muon (Muon takes: lr,",
        ),
        (["optim=lion", "+optim.kwargs.ns_steps=5"], "optim.kwargs.ns_steps is not a setting of optim.name=lion"),
        (["+optim.kwargs.lr=0.1"], "optim.kwargs.lr: set optim.lr instead"),
        (["+optim.kwargs.fallback_list=[head.*]"], "optim.kwargs.fallback_list is timm's parameter grouping"),
        (["optim.name=adahessian"], "optim.name=adahessian is a second-order optimizer"),
        (["+optim.kwargs.eps=1e-6"], "optim.kwargs.eps: set optim.eps instead"),
        (["optim=muon", "+optim.kwargs.conv_mode=sideways"], "optim.name=muon: Invalid conv_mode: sideways"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        cfg, model = tiny(*overrides)
        build_optimizer(model, cfg.optim, lr=1e-3, device=CPU)
    assert needle in str(err.value) and "\n" not in str(err.value)


# Two epochs of 4 steps on the CPU, deterministic: the second of them, resumed in a new run, ends on the same weights.
RESUMABLE = [*QUICK, "data.synthetic.num_train=128", "trainer.epochs=2", "trainer.deterministic=true"]


@pytest.mark.parametrize("name", ["lion", "muon"])
def test_a_resumed_run_ends_where_the_straight_one_does(name, tmp_path):
    assert_resumes_exactly([*RESUMABLE, f"optim={name}"], tmp_path)


@pytest.fixture(scope="module")
def muon_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("muon")
    run(compose_config([*QUICK, "data.synthetic.num_train=64", "trainer.epochs=1", "optim=muon"]), output_dir=run_dir)
    return run_dir


def test_a_muon_checkpoint_resumes_only_as_muon(muon_run, tmp_path):
    """adamuon is the same class as muon: the saved optim.name, not the class, tells them apart."""
    last = muon_run / "checkpoints" / "last.pt"
    cfg = compose_config([*QUICK, "trainer.epochs=2", "optim=muon", "optim.name=adamuon", f"trainer.resume={last}"])
    with pytest.raises(CheckpointError) as err:
        run(cfg, output_dir=tmp_path)
    assert str(err.value) == (
        f"checkpoint {str(last)!r} was trained with optim.name=muon, this run uses optim.name=adamuon: "
        "resume with optim.name=muon"
    )


def test_a_muon_checkpoint_evaluates(muon_run, capsys):
    assert evaluate_main([f"checkpoint={muon_run / 'checkpoints' / 'last.pt'}", "device=cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    val = "val_ema" if result["weights"] == "ema" else "val"  # ema=auto: the EMA weights where the run kept them
    assert_evaluates_as_the_run(result, json.loads((muon_run / "metrics.json").read_text()), val)


# --- optim.name beside another group's rate and weight decay ------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "group", "given", "expected"),
    [
        (
            ["optim.name=lion"],
            "adamw",
            set(),
            "optim.name=lion runs with optim.lr=0.001 and optim.weight_decay=0.05, chosen for adamw (the config group "
            "optim=adamw); optim=lion sets a rate and weight decay chosen for it (or set optim.lr and "
            "optim.weight_decay)",
        ),
        (["optim.name=lion", "optim.lr=1e-4"], "adamw", {"optim.lr"}, "runs with optim.weight_decay=0.05, chosen"),
        (["optim.name=clion"], "adamw", set(), "; set optim.lr and optim.weight_decay for clion"),  # no optim=clion
        (["optim=sgd", "optim.name=adamw"], "sgd", set(), "runs with optim.lr=0.1 and optim.weight_decay=0.0005"),
        (
            ["optim.name=lion", "optim.lr=1e-4", "optim.weight_decay=0.5"],
            "adamw",
            {"optim.lr", "optim.weight_decay"},
            None,
        ),  # fmt: skip
        (["optim=lion"], "lion", set(), None),  # the group's own optimizer
        (["optim.name=adamw"], "adamw", {"optim.name"}, None),
        (["optim.name=lion"], None, set(), None),  # composed without Hydra: no group known
    ],
)
def test_another_optimizer_keeping_the_groups_rate_and_decay_is_named(overrides, group, given, expected):
    line = kept_settings_warning(compose_config(overrides).optim, group, given)
    if expected is None:
        assert line is None
    else:
        assert line is not None and expected in line and "\n" not in line, line
        assert line.startswith(f"optim.name={compose_config(overrides).optim.name} runs with")


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["optim.name=lion"], True),
        (["optim.name=lion", "optim.lr=1e-4", "optim.weight_decay=0.5"], False),  # the user chose both
        (["optim=lion"], False),
    ],
)
def test_the_warning_reads_the_group_and_the_users_keys_from_hydra(overrides, warned, tmp_path):
    """Through the command line: Hydra's record of the job says which group was composed and which keys the user
    set. `search.trial` without a study stops the run right after the settings' check (check_search), so nothing
    trains; the warning comes before it, once."""
    done = run_cli([*QUICK, *overrides, "search.trial=0", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert done.returncode == 2 and "search.trial is set but search.storage is not" in done.stderr
    lines = [line for line in done.stdout.splitlines() if "optim.name=lion runs with" in line]
    if warned:
        (line,) = lines
        assert "[WARNING]" in line and "optim.lr=0.001 and optim.weight_decay=0.05, chosen for adamw" in line
    else:
        assert lines == []
