"""FedOD and the detection baselines on tiny scenes: the detector, distillation, roles, privacy, backends."""

import math

import numpy as np
import pytest
import torch
from conftest import RecordingExecutor, assert_same_results

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.methods.detection.fedod.distillation import channel_wise_distillation, multi_teacher_loss
from fedsim.models.detector import DetectorSpec, build_detector, head_keys, save_weights
from fedsim.models.normalization import bn_keys
from fedsim.registry import METHODS
from fedsim.runtime import Server
from fedsim.seeding import derive_seed

FAMILIES = {"wg", "wb", "wi", "wi_final", "ens_wbf", "ens_nms", "ens_soft_nms", "ens_nmw"}
FUSIONS = ("wbf", "nms", "soft_nms", "nmw")
#: the same ensembles again as variants (fused score avg, weights 1, 1: the defaults) and two other settings
VARIANTS = ["method.variant_confs=avg,max", "method.variant_weights=1,1,1,2"]
VARIANT_FAMILIES = {"ens_wbf_avg", "ens_wbf_max"} | {f"ens_{m}_w{w}" for m in FUSIONS for w in ("1_1", "1_2")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One server host, one labeled client (farm), the unlabeled target (dusk); tiny detector, one step each."""
    cache = tmp_path_factory.getbasetemp() / "scenes-tiny-cache"  # shared with test_scenes: built once per session
    return [
        "data.benchmark=scenes",
        "data.variant=tiny",
        "data.target=dusk",
        "data.sources=server,farm",
        f"data.cache_dir={cache}",
        "run.rounds=1",
        "run.progress=false",
        "run.tensorboard=false",
        "method.batch_size=4",
        "method.lr=0.01",
        "method.width=4",
        "method.fpn_channels=8",
        "method.head_convs=1",
        "method.base_iters=2",
        "method.client_iters=1",
    ]


METHOD_ONLY = {"fedod": ["method.distill_iters=1"], "fedrep_det": ["method.head_iters=1"]}


def options(tiny, method, *extra):
    return tiny + [f"method.name={method}", *METHOD_ONLY.get(method, []), *extra]


def run_local(opts):
    config = load_config(None, opts)
    federation = build_federation(config.data)
    METHODS.get(config.method.name).check_setting(config, federation)  # as fedsim.run does before anything is written
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    metrics = server.run_round(1, evaluate=True)
    return config, federation, executor, server, metrics


@pytest.fixture(scope="module")
def fedod_run(tiny):
    return run_local(options(tiny, "fedod", *VARIANTS))


# ---------------------------------------------------------------------------- detector


def test_detector_maps_loss_detect_and_weights(tmp_path):
    spec = DetectorSpec(num_classes=3, image_size=64, width=4, fpn_channels=8, head_convs=1)
    model = build_detector(spec, seed=0)
    images = torch.rand(2, 3, 64, 64)
    maps = model.maps(images)
    assert [tuple(f.shape) for f in maps["features"]] == [(2, 8, 8, 8), (2, 8, 4, 4), (2, 8, 2, 2)]
    assert [tuple(c.shape) for c in maps["cls_logits"]] == [(2, 3, 8, 8), (2, 3, 4, 4), (2, 3, 2, 2)]
    assert [tuple(r.shape) for r in maps["bbox_regression"]] == [(2, 4, 8, 8), (2, 4, 4, 4), (2, 4, 2, 2)]
    targets = [
        {"boxes": torch.tensor([[4.0, 4.0, 30.0, 30.0]]), "labels": torch.tensor([1])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)},
    ]
    losses = model.loss(maps, targets)
    assert set(losses) == {"classification", "bbox_regression", "bbox_ctrness"} and all(
        torch.isfinite(v) for v in losses.values()
    )
    out = model.detect(images)
    assert len(out) == 2 and set(out[0]) == {"boxes", "scores", "labels"} and model.training
    bn, head = bn_keys(model), head_keys(model)
    assert bn and head and not bn & head and all(k.startswith("backbone.") for k in bn)
    path = save_weights(model, tmp_path / "w.npz")
    loaded = build_detector(DetectorSpec(**{**spec.__dict__, "weights": str(path)}), seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(UserError, match="does not fit"):
        build_detector(DetectorSpec(**{**spec.__dict__, "num_classes": 5, "weights": str(path)}))
    with pytest.raises(UserError, match="does not exist"):
        build_detector(DetectorSpec(**{**spec.__dict__, "weights": str(tmp_path / "none.npz")}))


def test_channel_wise_distillation_by_hand():
    teacher = torch.tensor([math.log(3.0), 0.0]).reshape(1, 1, 1, 2)
    student = torch.zeros(1, 1, 1, 2)
    # softmax(teacher) = (3/4, 1/4), softmax(student) = (1/2, 1/2): KL = 3/4 ln 1.5 + 1/4 ln 0.5
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert channel_wise_distillation(student, teacher, 1.0).item() == pytest.approx(expected, rel=1e-5)
    t2 = torch.tensor([math.log(9.0), 0.0]).reshape(
        1, 1, 1, 2
    )  # T = 2 halves the logits: same distributions, times T^2
    assert channel_wise_distillation(student, t2, 2.0).item() == pytest.approx(4 * expected, rel=1e-5)
    x = torch.randn(2, 3, 4, 4)
    assert channel_wise_distillation(x, x, 4.0).item() == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------- fedod


def test_fedod_round_reports_every_family(fedod_run):
    config, federation, _, _, metrics = fedod_run
    assert {"base_loss", "train_loss", "distill_loss"} <= set(metrics)
    final = metrics["final_detection"]
    assert final is metrics["detection"] and metrics["final_alpha"] == 0.3
    assert set(final) == FAMILIES | VARIANT_FAMILIES
    for name, entry in final.items():
        assert all(
            0.0 <= entry[k] <= 1.0 for k in ("A_s", "A_p", "A_u", "AP50_s", "AP50_p", "AP50_u", "A_u_own", "AP50_u_own")
        )
        assert entry["A_com"] == pytest.approx(0.3 * entry["A_s"] + 0.7 * entry["A_p"])
        assert entry["A_p"] == pytest.approx(np.mean([c["p"] for c in entry["clients"].values()]))
        assert ("target" in entry) == (name in ("wg", "wb"))
    # a variant with the default settings scores exactly what the default ensemble scores
    assert final["ens_wbf_avg"] == final["ens_wbf"]
    assert all(final[f"ens_{m}_w1_1"] == final[f"ens_{m}"] for m in FUSIONS)
    assert set(metrics["source_accuracy"]) == {"server", "farm"} and metrics["target_accuracy"] == final["wg"]["target"]
    assert metrics["source_accuracy"]["server"] == final["wg"]["A_s"]
    assert metrics["source_accuracy"]["farm"] == pytest.approx(final["wg"]["clients"]["1"]["p"])
    assert metrics["primary_A_com"] == final["wg"]["A_com"]


def test_final_ensemble_uses_the_fine_tune_of_the_final_global_model(fedod_run):
    _, _, executor, server, _ = fedod_run
    host, farm = executor.host, 1
    fits = [ins[farm] for ins, _ in executor.calls if farm in ins and ins[farm].operation == "fit"]
    assert [fit.values["slot"] for fit in fits] == ["personal", "final"] and fits[1].seed != fits[0].seed
    assert fits[1].seed == derive_seed(server.config.run.seed, fits[1].round, farm, "final_fit")
    w_g = server.state["weights"]  # w_g^R, the last distillation's student
    assert all(np.array_equal(fits[1].tensors[k], w_g[k]) for k in w_g)
    final = host.private_state(farm)["own"]["final"]
    on_server = host.private_state(0)["own"][f"final@{farm}"]
    assert all(np.array_equal(final[k], on_server[k]) for k in final)
    assert any(not np.array_equal(final[k], w_g[k]) for k in final)
    evaluations = [ins for ins, _ in executor.calls if next(iter(ins.values())).operation == "evaluate"]
    predictors = evaluations[-1][farm].values["predictors"]
    assert predictors["ens_wbf"]["sources"] == ["payload:wg", "own:final"] and predictors["wi_final"]["sources"] == [
        "own:final"
    ]
    assert evaluations[-1][0].values["predictors"][f"ens_wbf@{farm}"]["sources"] == ["payload:wg", f"own:final@{farm}"]


def test_a_u_scores_each_clients_model_on_the_server_set_and_every_clients_set(tiny):
    """The paper's A_u (its L_U): client i's model M_i on S u T_night u T_farm, pycocotools on the pooled images;
    A_u_deployed scores each T_j with client j's own model. Two clients, models trained enough to find boxes."""
    from fedsim.detection.fusion import fuse
    from fedsim.detection.metrics import coco_map
    from fedsim.methods.common.training import load_numpy
    from fedsim.methods.detection.evaluation import detect_all

    trained = ["data.sources=server,night,farm", "method.base_iters=40", "method.client_iters=10", "method.lr=0.05"]
    config, federation, executor, server, metrics = run_local(options(tiny, "fedod", *trained))
    host, clients = executor.host, (1, 2)
    # the clients share their own models for the evaluation only, after the round's training
    ops = [(cid, op) for _, cid, op, _ in executor.log]
    assert ops[-6:] == [
        (1, "share_own"),
        (2, "share_own"),
        (0, "evaluate"),
        (1, "evaluate"),
        (2, "evaluate"),
        (3, "evaluate"),
    ]
    evaluation = next(ins for ins, _ in executor.calls if next(iter(ins.values())).operation == "evaluate")
    prefixes = {cid: {k.partition("/")[0] for k in ins.tensors} for cid, ins in evaluation.items()}
    assert prefixes == {
        0: {"wb", "wg"},
        1: {"wb", "wg", "personal@2", "final@2"},
        2: {"wb", "wg", "personal@1", "final@1"},
        3: {"wb", "wg"},
    }
    tests = {cid: load_client_data(config.data, federation, cid).test for cid in (0, *clients)}
    model, k = build_detector(server.method.spec), federation.num_classes

    def detections(weights):
        load_numpy(model, weights)
        return {cid: detect_all(model, split.x, 50) for cid, split in tests.items()}

    w_g = detections(server.state["weights"])
    final = {cid: detections(host.private_state(cid)["own"]["final"]) for cid in clients}
    wbf = dict(next(f for f in server.method.families(1) if f.name == "ens_wbf").options)
    size = tuple(tests[0].x.shape[-2:])
    ensemble = {
        cid: {h: [fuse([g, p], size, method="wbf", **wbf) for g, p in zip(w_g[h], final[cid][h])] for h in tests}
        for cid in clients
    }

    def pooled(dets_by_holder):  # pycocotools on S u T_night u T_farm, the images pooled
        truth = [t for h in (0, *clients) for t in tests[h].targets]
        return coco_map(truth, [d for h in (0, *clients) for d in dets_by_holder[h]], k)["mAP"]

    scores = metrics["final_detection"]
    for family, models in (("wi_final", final), ("ens_wbf", ensemble)):
        for cid in clients:
            entry = scores[family]["clients"][str(cid)]
            assert entry["u"] == pytest.approx(pooled(models[cid]), abs=1e-12)
            deployed = {0: models[cid][0], **{j: models[j][j] for j in clients}}
            assert entry["ud"] == pytest.approx(pooled(deployed), abs=1e-12)
        assert scores[family]["A_u"] == pytest.approx(
            np.mean([scores[family]["clients"][str(c)]["u"] for c in clients])
        )
    assert scores["wg"]["A_u"] == pytest.approx(pooled(w_g), abs=1e-12) == scores["wg"]["A_u_deployed"]
    assert scores["wi_final"]["A_u"] > 0 and scores["ens_wbf"]["A_u"] > 0


def test_distillation_terms_at_zero_leave_the_same_server_steps_on_the_detection_loss(tiny):
    """The control of the distillation claim: lambda_feat = lambda_cls = lambda_reg = 0 gives w_g = distill_iters
    steps of the detection loss alone from mean(w_g, w_1), on the same batches; with the terms w_g differs."""
    from fedsim.methods.common.aggregation import weighted_average
    from fedsim.methods.common.training import load_numpy, model_to_numpy
    from fedsim.methods.detection.evaluation import prefixed
    from fedsim.methods.detection.training import DetectionSet

    zero = ["method.lambda_feat=0", "method.lambda_cls=0", "method.lambda_reg=0", "method.distill_iters=3"]
    config, federation, executor, server, metrics = run_local(options(tiny, "fedod", *zero))
    assert (metrics["distill_last_feat"], metrics["distill_last_cls"], metrics["distill_last_reg"]) == (0.0, 0.0, 0.0)
    distill = next(ins[0] for ins, _ in executor.calls if 0 in ins and ins[0].operation == "distill")
    method, data = server.method, load_client_data(config.data, federation, 0)
    student = method.new_model()
    start = [prefixed(distill.tensors, "global"), prefixed(distill.tensors, "teacher@1")]
    load_numpy(student, weighted_average(start, [1.0, 1.0]))
    train = DetectionSet.build(data.train.x, data.train.targets)
    loss = method.local_train(student, train, 3, distill.local, distill.seed)
    assert metrics["distill_loss"] == pytest.approx(loss, rel=1e-6)
    expected = model_to_numpy(student)
    for name, value in server.state["weights"].items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    distilled = run_local(options(tiny, "fedod", "method.distill_iters=3"))[3].state["weights"]
    assert any(not np.allclose(distilled[k], expected[k], rtol=1e-3, atol=1e-4) for k in expected)


def test_two_identical_teachers_distil_as_one():
    spec = DetectorSpec(num_classes=3, image_size=64, width=4, fpn_channels=8, head_convs=1)
    student, teacher = build_detector(spec, seed=0), build_detector(spec, seed=1).eval()
    images = torch.rand(2, 3, 64, 64)
    maps = student.maps(images)
    params = METHODS.get("fedod").Params(lambda_feat=0.1, lambda_cls=1.0, lambda_reg=1.0)
    one, two = {}, {}
    loss_one = multi_teacher_loss([teacher], params, one)(images, maps)
    loss_two = multi_teacher_loss([teacher, teacher], params, two)(images, maps)
    assert loss_two.item() == pytest.approx(loss_one.item(), rel=1e-6) and loss_one.item() > 0
    assert two == pytest.approx(one)


def test_two_rounds_report_w_i_of_the_first_and_the_last_round(tiny):
    config = load_config(None, options(tiny, "fedod", "run.rounds=2"))
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    server.run_round(1, evaluate=False)
    metrics = server.run_round(2, evaluate=True)
    assert {"wi_first", "wi", "wi_final"} <= set(metrics["final_detection"])
    fits = [replies[1] for ins, replies in executor.calls if 1 in ins and ins[1].operation == "fit"]
    assert len(fits) == 3  # round 1, round 2, the final fine-tune
    own = executor.host.private_state(1)["own"]
    for slot, reply in (("first", fits[0]), ("personal", fits[1]), ("final", fits[2])):
        assert all(np.array_equal(own[slot][k], reply.tensors[k]) for k in own[slot])
    assert all(
        np.array_equal(executor.host.private_state(0)["own"]["first@1"][k], fits[0].tensors[k]) for k in own["first"]
    )


def test_fusion_variants_are_checked(tiny):
    with pytest.raises(UserError, match="variant_confs"):
        load_config(None, options(tiny, "fedod", "method.variant_confs=median"))
    with pytest.raises(UserError, match="pairs"):
        load_config(None, options(tiny, "fedod", "method.variant_weights=1,2,3"))


def test_fedod_keeps_images_on_their_hosts_and_models_where_they_belong(fedod_run):
    config, federation, executor, server, _ = fedod_run
    host = executor.host
    server_id, farm_id = 0, 1
    ops = [(cid, op) for _, cid, op, _ in executor.log]
    assert ops == [
        (server_id, "train_base"),
        (farm_id, "fit"),
        (server_id, "distill"),
        (farm_id, "fit"),
        (server_id, "keep_teachers"),
        (0, "evaluate"),
        (1, "evaluate"),
        (2, "evaluate"),
    ]
    for _, cid, op, reply in executor.log:
        data = load_client_data(config.data, federation, cid)
        for name, tensor in reply.tensors.items():
            tensor = np.asarray(tensor)
            assert tensor.shape[1:] != data.test.x.shape[1:], f"{op} reply {name} looks like images"
            if op == "evaluate":
                assert name.split("/")[-1] in ("category", "scores", "matched", "ignored", "gt_count")
    # w_i stays with the farm client and reaches the server host only as a teacher
    personal = host.private_state(farm_id)["own"]["personal"]
    teacher = host.private_state(server_id)["own"][f"teacher@{farm_id}"]
    assert all(np.array_equal(personal[k], teacher[k]) for k in personal)
    assert any(not np.array_equal(personal[k], server.state["weights"][k]) for k in personal)
    # the server process holds models only: named weight arrays, no data
    for key in ("weights", "base"):
        assert set(server.state[key]) == set(personal)


@pytest.mark.parametrize(
    "method, extra",
    [
        ("fedavg_det", []),
        ("fedbn_det", []),
        ("fedrep_det", []),
        ("fedod", ["method.mode=baseline1"]),
        ("fedod", ["method.mode=baseline2"]),
    ],
)
def test_baselines_run_and_keep_personal_parts_local(tiny, method, extra):
    config, federation, executor, server, metrics = run_local(options(tiny, method, *extra))
    final = metrics["final_detection"]
    model = build_detector(server.method.spec)
    if method == "fedod":
        assert set(final) == (
            {"wb"}
            if "method.mode=baseline1" in extra
            else {"wb", "wi", "ens_wbf", "ens_nms", "ens_soft_nms", "ens_nmw"}
        )
        assert all(
            np.array_equal(server.state["weights"][k], server.state["base"][k]) for k in server.state["base"]
        )  # w_g stays w_b
        return
    assert set(final) == ({"global"} if method == "fedavg_det" else {"global", "personal"})
    private = {"fedavg_det": set(), "fedbn_det": bn_keys(model), "fedrep_det": head_keys(model)}[method]
    fits = [reply for _, _, op, reply in executor.log if op == "fit"]
    assert len(fits) == 2 and all(set(r.tensors) == set(model.state_dict()) - private for r in fits)
    if private:
        shared = [reply for _, _, op, reply in executor.log if op == "share_personal"]
        assert len(shared) == 1 and set(shared[0].tensors) == private


def test_bad_setups_raise_user_errors(tiny, toy_overrides):
    base = options(tiny, "fedod")
    with pytest.raises(UserError, match="detection benchmark"):
        run_local(toy_overrides + ["method.name=fedod"])
    with pytest.raises(UserError, match="cannot be the target"):
        run_local([o for o in base if not o.startswith("data.sources")] + ["data.target=server"])
    with pytest.raises(UserError, match="clients_per_domain=1"):
        run_local(base + ["data.clients_per_domain=2"])
    with pytest.raises(UserError, match="IID"):
        run_local(base + ["data.partition=dirichlet"])
    with pytest.raises(UserError, match="besides 'server'"):
        run_local([o for o in base if not o.startswith("data.sources")] + ["data.sources=server"])
    with pytest.raises(UserError, match="method.mode"):
        load_config(None, base + ["method.mode=ensemble"])
    config = load_config(None, base + ["data.partition=dirichlet"])
    with pytest.raises(UserError, match="IID"):  # the method refuses the scenario itself too, not only check_setting
        METHODS.get("fedod")(config, build_federation(config.data))


def test_local_and_ray_agree(tiny, ray_cluster, tmp_path):
    results = {}
    for backend in ("local", "ray"):
        config = load_config(
            None, options(tiny, "fedod", f"run.backend={backend}", "run.seed=3", "resources.cpus_per_client=1")
        )
        results[backend] = run_experiment(config, tmp_path / backend)
    assert_same_results(results["local"], results["ray"], ("final_detection", "target_accuracy", "bytes_sent"))
