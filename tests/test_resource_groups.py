"""``resources.groups``: other CPUs and GPUs for a role or a domain; clients of different resources on actors of
their own, a sweep trial's bundles one per actor; the numbers the same on both backends."""

import logging

import pytest
from conftest import assert_same_results

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.errors import UserError

backend = pytest.importorskip("fedsim.actors.backend")

TARGET_GPUS = "resources.groups={target: {gpus_per_client: 0.5}}"


@pytest.fixture(scope="module")
def six(toy_overrides):
    """Two clients per domain: sources dom0 (clients 0, 1) and dom2 (4, 5), target dom1 (2, 3)."""
    return [*toy_overrides, "data.clients_per_domain=2"]


def plan_on(monkeypatch, config, cluster: dict):
    monkeypatch.setattr(backend.ray, "cluster_resources", lambda: dict(cluster))
    return backend.plan_actors(config, build_federation(config.data))


def classes_per_actor(plan, config, federation) -> list[set]:
    """The resources each actor's clients ask for (after a GPU-less cluster's fallback: what the actor reserves)."""
    return [
        {
            (
                config.resources.of_client(federation.info(cid).domain, federation.info(cid).role)[0],
                plan.resources[a][1],
            )
            for cid, a in plan.assignment.items()
            if a == index
        }
        for index in range(plan.count)
    ]


# ---------------------------------------------------------------------------------------------------- the config


def test_a_domain_overrides_its_role_key_by_key(toy_overrides, tmp_path):
    config = load_config(
        None,
        [
            *toy_overrides,
            "resources.cpus_per_client=2",
            "resources.groups={source: {gpus_per_client: 0.25, cpus_per_client: 3}, dom2: {cpus_per_client: 0.5}}",
        ],
    )
    resources = config.resources
    assert resources.of_client("dom0", "source") == (3.0, 0.25)  # the role's two keys
    assert resources.of_client("dom2", "source") == (0.5, 0.25)  # the domain's CPUs, the role's GPUs
    assert resources.of_client("dom1", "target") == (2.0, 0.0)  # no group: the section's
    yaml_file = tmp_path / "groups.yaml"
    yaml_file.write_text("resources:\n  groups:\n    target:\n      gpus_per_client: 0.5\n")
    from_yaml = load_config(yaml_file, toy_overrides).resources
    assert from_yaml.of_client("dom1", "target") == (1.0, 0.5) and from_yaml.of_client("dom0", "source") == (1.0, 0.0)
    assert from_yaml.groups == load_config(None, [*toy_overrides, TARGET_GPUS]).resources.groups


@pytest.mark.parametrize(
    "groups, message",
    [
        (
            "{kitchen: {cpus_per_client: 2}}",
            "resources.groups names 'kitchen', neither a role (source, target) nor a domain of benchmark 'npz': "
            "use source, target, dom0, dom1, dom2",
        ),
        ("{targt: {cpus_per_client: 2}}", "did you mean 'target'?"),
        (
            "{target: {gpu_per_client: 0.5}}",
            "unknown config key 'resources.groups.target.gpu_per_client': a group sets cpus_per_client "
            "and gpus_per_client only: did you mean 'gpus_per_client'?",
        ),
        (
            "{target: {vectorize: auto}}",
            "unknown config key 'resources.groups.target.vectorize': a group sets cpus_per_client and "
            "gpus_per_client only",
        ),
        (
            "{target: {gpus_per_client: -0.5}}",
            "resources.groups.target.gpus_per_client must be 0 or a positive number, got -0.5",
        ),
        ("{source: {cpus_per_client: -1}}", "resources.groups.source.cpus_per_client must be a positive number"),
        ("{source: {cpus_per_client: 0}}", "resources.groups.source.cpus_per_client must be a positive number"),
        ("{source: {cpus_per_client: many}}", "must be a positive number, got 'many'"),
        ("{source: 2}", "resources.groups.source must map cpus_per_client and gpus_per_client to numbers"),
        ("target", "resources.groups must map client groups to resources, got 'target'"),
    ],
)
def test_bad_groups_are_one_line(toy_overrides, groups, message):
    with pytest.raises(UserError) as caught:
        load_config(None, [*toy_overrides, f"resources.groups={groups}"])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_cli_refuses_a_bad_group_with_exit_code_2(toy_overrides, capsys, tmp_path):
    from fedsim.experiments.cli import main

    args = [f"--set={o}" for o in toy_overrides] + ["--set=resources.groups={dom7: {gpus_per_client: 1}}"]
    assert main(["run", "--backend", "local", "--out", str(tmp_path / "run"), *args]) == 2
    assert "resources.groups names 'dom7'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_encoder_cache_key_tells_the_groups_and_their_device_apart(toy_overrides, tmp_path):
    """FedDaDiL's shared encoder stage: a group's resources, and GPUs a group asks for on Ray (CUDA) against the
    local backend (CPU), are other keys; the same groups on the same backend are the same key."""
    from fedsim.methods.dictionary.feddadil import FedDaDiL

    base = [*toy_overrides, "method.name=feddadil", "method.encoder_rounds=1", f"run.cache_dir={tmp_path}"]

    def key(*extra):
        config = load_config(None, base + list(extra))
        return FedDaDiL(config, build_federation(config.data)).encoder.cache.name

    source_gpus = "resources.groups={source: {gpus_per_client: 0.5}}"
    names = [
        key("run.backend=ray"),
        key("run.backend=ray", source_gpus),
        key("run.backend=local", source_gpus),
        key("run.backend=ray", "resources.groups={dom2: {cpus_per_client: 2}}"),
    ]
    assert len(set(names)) == 4
    assert key("run.backend=ray", source_gpus) == names[1]


# ---------------------------------------------------------------------------------------------------- plan_actors


def test_each_resource_class_gets_actors_of_its_own(six, monkeypatch):
    config = load_config(None, [*six, TARGET_GPUS])
    plan = plan_on(monkeypatch, config, {"CPU": 8.0, "GPU": 1.0})
    source, target = (1.0, 0.0), (1.0, 0.5)
    # one actor per class, then one more per class in turn while it has more clients than actors
    assert plan.resources == (source, target, source, target, source, source)
    # round-robin within a class, sources in client order: dom0's two clients, then dom2's
    assert plan.assignment == {0: 0, 1: 2, 4: 4, 5: 5, 2: 1, 3: 3}
    assert all(len(kinds) == 1 for kinds in classes_per_actor(plan, config, build_federation(config.data)))


def test_the_cluster_ends_the_plan_at_the_first_actor_that_does_not_fit(six, monkeypatch):
    config = load_config(None, [*six, TARGET_GPUS])
    source, target = (1.0, 0.0), (1.0, 0.5)
    four_cpus = plan_on(monkeypatch, config, {"CPU": 4.0, "GPU": 1.0})
    assert four_cpus.resources == (source, target, source, target)
    assert four_cpus.assignment == {0: 0, 1: 2, 4: 0, 5: 2, 2: 1, 3: 3}
    # half a GPU: the second target actor does not fit, and the plan ends there (no source actor after it)
    half_gpu = plan_on(monkeypatch, config, {"CPU": 8.0, "GPU": 0.5})
    assert half_gpu.resources == (source, target, source)
    assert half_gpu.assignment == {0: 0, 1: 2, 4: 0, 5: 2, 2: 1, 3: 1}
    capped = load_config(None, [*six, TARGET_GPUS, "ray.max_actors=3"])
    assert plan_on(monkeypatch, capped, {"CPU": 8.0, "GPU": 1.0}).resources == (source, target, source)


def test_a_cluster_too_small_for_one_actor_per_class_is_one_line(six, monkeypatch):
    config = load_config(None, [*six, "resources.groups={dom2: {cpus_per_client: 2}}"])
    with pytest.raises(UserError) as caught:
        plan_on(monkeypatch, config, {"CPU": 2.5})
    assert str(caught.value) == (
        "resources.groups gives the clients 2 different resources (1 CPUs, 2 CPUs), one actor each at least: 3 CPUs "
        "and 0 GPUs together, more than the Ray cluster's 2.5 CPUs and 0 GPUs: lower the groups' cpus_per_client or "
        "gpus_per_client, or wait for worker nodes (ray status)"
    )
    capped = load_config(None, [*six, "resources.groups={dom2: {cpus_per_client: 2}}", "ray.max_actors=1"])
    with pytest.raises(UserError, match="ray.max_actors=1: raise it to 2 or set fewer groups"):
        plan_on(monkeypatch, capped, {"CPU": 8.0})
    # without groups a single class keeps one actor even where it does not fit (Ray starts it once there is room)
    alone = load_config(None, [*six, "resources.cpus_per_client=4"])
    assert plan_on(monkeypatch, alone, {"CPU": 2.0}).resources == ((4.0, 0.0),)


def test_without_gpus_the_groups_run_on_cpu_with_one_warning(six, monkeypatch, caplog):
    config = load_config(None, [*six, "resources.groups={target: {gpus_per_client: 0.5}, dom2: {gpus_per_client: 1}}"])
    with caplog.at_level(logging.WARNING, logger="fedsim.actors.backend"):
        plan = plan_on(monkeypatch, config, {"CPU": 3.0})
    assert [r.getMessage() for r in caplog.records] == [
        "the clients of dom1 (0.5 each), dom2 (1 each) asked for GPUs but the Ray cluster has none: running on CPU"
    ]
    # every client now asks for 1 CPU and no GPU: one class, spread as without groups
    assert plan.resources == ((1.0, 0.0),) * 3 and plan.assignment == {0: 0, 1: 1, 4: 2, 5: 0, 2: 1, 3: 2}


def test_without_groups_the_plan_is_the_single_class_arithmetic(six, monkeypatch):
    """min(clients, CPUs // cpus_per_client, GPUs // gpus_per_client, max_actors), round-robin, sources first."""
    config = load_config(None, [*six, "resources.cpus_per_client=0.5", "resources.gpus_per_client=0.25"])
    plan = plan_on(monkeypatch, config, {"CPU": 2.0, "GPU": 2.0})
    assert plan.resources == ((0.5, 0.25),) * 4 and plan.assignment == {0: 0, 1: 1, 4: 2, 5: 3, 2: 0, 3: 1}
    assert plan_on(monkeypatch, config, {"CPU": 8.0, "GPU": 0.5}).count == 2


# ---------------------------------------------------------------------------------------------------- sweep bundles


def test_a_trial_reserves_one_bundle_per_actor_with_its_resources(six):
    from fedsim.experiments.sweep_trial import TRIAL_CPUS, TrialPlan, plan_trial

    config = load_config(None, [*six, TARGET_GPUS])
    plan = plan_trial(config, 6, {"CPU": 4.05, "GPU": 1.0})
    # 3.95 CPUs for client actors: source, target, source; the second target actor (4 CPUs) does not fit
    assert plan == TrialPlan(3, 1.0, 0.0, ((1.0, 0.0), (1.0, 0.5), (1.0, 0.0)))
    assert plan.bundles() == [{"CPU": TRIAL_CPUS}, {"CPU": 1.0}, {"CPU": 1.0, "GPU": 0.5}, {"CPU": 1.0}]
    # without GPUs the classes merge: the plain single-class plan and bundles
    assert plan_trial(config, 6, {"CPU": 4.05}) == TrialPlan(3, 1.0, 0.0)
    with pytest.raises(UserError, match="more than the Ray cluster's 2 CPUs \\(0.1 of them for the trial\\)"):
        plan_trial(config, 6, {"CPU": 2.0, "GPU": 1.0})


def test_the_trial_run_plans_the_actors_of_its_bundles(six, monkeypatch):
    """Inside a trial the run sees the whole cluster and ``ray.max_actors`` = its bundles: it plans the same actors
    in the same order, so each actor matches its bundle (and own_bundles pins it there)."""
    from fedsim.experiments.sweep_trial import plan_trial

    groups = "resources.groups={target: {cpus_per_client: 2, gpus_per_client: 0.5}}"
    config = load_config(None, [*six, groups])
    cluster = {"CPU": 5.0, "GPU": 1.0}
    trial = plan_trial(config, 6, cluster)
    assert trial.per_actor == ((1.0, 0.0), (2.0, 0.5), (1.0, 0.0))  # 4.9 CPUs: a second target would need 6
    in_trial = load_config(None, [*six, groups, f"ray.max_actors={trial.actors}"])
    plan = plan_on(monkeypatch, in_trial, {"CPU": 16.0, "GPU": 4.0})
    assert plan.resources == trial.per_actor

    class Group:
        bundle_specs = trial.bundles()

    monkeypatch.setattr("ray.util.get_current_placement_group", lambda: Group)
    assert backend.own_bundles(plan.resources) == (Group, 1)
    assert backend.own_bundles(((2.0, 0.5), (1.0, 0.0))) == (Group, 2)  # the last two bundles
    assert backend.own_bundles(((1.0, 0.0), (1.0, 0.0), (2.0, 0.5))) is None  # no bundles in this order
    assert backend.own_bundles(((1.0, 0.0),) * 2) is None  # one class: Ray places the actors, as without groups


# ---------------------------------------------------------------------------------------------------- on Ray


def test_local_and_ray_agree_with_groups(toy_overrides, ray_cluster, tmp_path, caplog):
    """Resources only place work: with a target actor of its own (half a CPU, and half a GPU the 2-CPU test
    cluster lacks), the Ray run's summary and model equal the local run's."""
    groups = "resources.groups={target: {cpus_per_client: 0.5, gpus_per_client: 0.5}}"
    results = {}
    for name in ("local", "ray"):
        config = load_config(None, [*toy_overrides, groups, f"run.backend={name}", "run.seed=3"])
        if name == "ray":
            plan = backend.plan_actors(config, build_federation(config.data))
            # sources dom0, dom2 at 1 CPU; target dom1 at 0.5: source, target, then 2.5 CPUs > 2
            assert plan.resources == ((1.0, 0.0), (0.5, 0.0)) and plan.assignment == {0: 0, 1: 1, 2: 0}
        with caplog.at_level(logging.WARNING, logger="fedsim.actors.backend"):
            results[name] = run_experiment(config, tmp_path / name)
    warnings = [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()]
    assert warnings and set(warnings) == {
        "resources.gpus_per_client asks for a GPU but CUDA is not available here: the local backend runs every "
        "client on the CPU",
        "the clients of dom1 (0.5 each) asked for GPUs but the Ray cluster has none: running on CPU",
    }
    local, ray = results["local"].summary, results["ray"].summary
    differing = {k for k in local.keys() | ray.keys() if local.get(k) != ray.get(k)}
    assert differing == {"backend", "wall_seconds"} and local["rounds"] == 2 and "score_entropy" in local
    assert_same_results(results["local"], results["ray"], ("target_accuracy", "source_accuracy", "bytes_sent"))


def test_in_a_trials_placement_group_each_actor_takes_its_own_bundle(toy_overrides, ray_cluster, tmp_path):
    """A sweep trial's group (the coordinator's bundle, then one per actor): the run inside it pins each actor of a
    resource class to its bundle (1 CPU for the sources' actor, half a CPU for the target's) and finishes."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from fedsim.experiments.sweep_trial import TRIAL_CPUS, TrialPlan

    bundles = TrialPlan(2, 1.0, 0.0, ((1.0, 0.0), (0.5, 0.0))).bundles()
    group = placement_group(bundles)
    ray_cluster.get(group.ready(), timeout=60)
    overrides = [*toy_overrides, "resources.groups={target: {cpus_per_client: 0.5}}", "run.backend=ray", "run.rounds=1"]

    @ray_cluster.remote(num_cpus=TRIAL_CPUS)
    def trial(overrides, out):
        config = load_config(None, [*overrides, "ray.max_actors=2"])
        plan = backend.plan_actors(config, build_federation(config.data))
        pinned = backend.own_bundles(plan.resources)
        return plan.resources, pinned and pinned[1], run_experiment(config, out).summary["rounds"]

    strategy = PlacementGroupSchedulingStrategy(group, 0, placement_group_capture_child_tasks=True)
    try:
        result = ray_cluster.get(trial.options(scheduling_strategy=strategy).remote(overrides, str(tmp_path)))
    finally:
        remove_placement_group(group)
    assert result == (((1.0, 0.0), (0.5, 0.0)), 1, 1)
