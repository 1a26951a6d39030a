"""The coordinator's closing lines of a run, in its log: the best round, who never gave a
result, each member against itself alone (metrics.json's ``alone``), and where the models
are."""

from __future__ import annotations

from logging import INFO, WARNING

from flwr.supercore import log

import strategies
import tasks
from strategies.core.records import ACCURACY_SCORE, RunFile, client_scores, kept_said, round_score

from .recorder import RecordedRun
from .results import MODELS_FOLDER


def say_summary(run: RecordedRun, result: RunFile) -> None:
    """The log's summary of ``run``, whose metrics.json record is ``result``: the best round,
    who never gave a result, each member against itself alone, where the models are."""
    cfg, folder, names = run.cfg, run.folder, run.members.names
    cover = result.coverage or {}
    who = "clients" if cover["benign_clients"] == cover["num_clients"] else \
        "benign training clients"
    over = (f", over {cover.get('clients_in_best_round', 0)} of {cover['benign_clients']} "
            f"{who} (round {cover.get('best_round')})")
    score, best = result.headline()
    if best is not None and score.higher_is_better:
        log(INFO, "BMTA %.2f%% over %d rounds%s", best, cfg.num_server_rounds, over)
    elif best is not None:
        log(INFO, "Best mean test MSE %.4g over %d rounds%s", best, cfg.num_server_rounds,
            over)
    for cid, why in cover["never_evaluated"].items():
        log(WARNING, "Client %s never produced a result in this run: %s", cid, why)
    federates = strategies.STRATEGIES[cfg.strategy].federates
    for line in (alone_lines(result, names, federates) if names
                 else alone_summary(result, federates)):
        log(INFO, "%s", line)
    if cfg.strategy != "fedavg" and not names:
        log(INFO, "FedAvg on the same clients: the same command with --run-config "
            "\"strategy='fedavg'\" (one global model for all)")
    log(INFO, "Wrote %s", folder.metrics_path)
    if run.delivery is not None:
        _say_models(run)


def _say_models(run: RecordedRun) -> None:
    """Where the models kept are, and for whom none was kept."""
    assert run.delivery is not None
    cfg, folder = run.cfg, run.folder
    kept = [c for c, k in run.delivery.kept.items() if k["kept"]]
    where = (f"{folder.path / MODELS_FOLDER}" if cfg.dataset != tasks.MEMBERS else
             f"each member's node, in <model-dir>/{folder.name}/ (node config model-dir)")
    log(INFO, "Models kept (save-models = %s) for %d of %d clients, in %s; use one with: "
        "fedamp-flwr predict MODEL.safetensors DATA", cfg.save_models, len(kept),
        run.num_clients, where)
    missing = sorted(set(range(run.num_clients)) - set(kept))
    if missing:
        log(WARNING, "No model kept for client(s) %s (metrics.json: models; a member's own "
            "log says why)", missing)


def alone_lines(result: RunFile, names: list[str], federates: bool = True) -> list[str]:
    """Each member's last score beside what it scores alone (metrics.json's ``alone``): the
    coordinator's table of what federation gave each member, by name (``federates``: False
    for a method whose clients each train alone, which is never said to do worse by
    federation)."""
    alone = result.alone or {}
    last = result.rounds[-1] if result.rounds else {}
    score = round_score(last) or ACCURACY_SCORE
    main, scores = score.metric, client_scores(last, score)
    lines = []
    for cid, own in sorted(alone.items(), key=lambda kv: int(kv[0])):
        if cid not in scores and int(cid) not in scores:
            continue
        mine = float(scores.get(cid, scores.get(int(cid), 0.0)))
        who = names[int(cid)] if int(cid) < len(names) else f"client {cid}"
        measured = [own[k] for k in ("linear", "model") if k in own]
        if not measured:  # the run did not train alone (alone = false): its choice only
            lines.append(f"{who}: {main} {score.scale * mine:.4g} in round "
                         f"{last.get('round')}{kept_said(own)}")
            continue
        gain, scale = score.gain(mine, measured), score.scale
        lines.append(f"{who}: {main} {scale * mine:.4g} in round {last.get('round')}; alone "
                     f"{scale * own.get('linear', float('nan')):.4g} (linear), "
                     f"{scale * own.get('model', float('nan')):.4g} (the run's model): "
                     f"{scale * gain:+.3g}" + ("" if gain >= 0 or not federates else
                                               " (federation does worse on the test rows)")
                     + kept_said(own))
    return lines


def alone_summary(result: RunFile, federates: bool = True) -> list[str]:
    """The closing lines of a partitioned run whose clients also trained alone (``alone``):
    the mean of the last round's scores of its benign clients against the mean of their
    models trained alone, on the same test rows, and for how many federation did better
    (``federates``: as :func:`alone_lines`)."""
    alone, last = result.alone or {}, result.rounds[-1] if result.rounds else {}
    score = round_score(last) or ACCURACY_SCORE
    scores = {str(c): float(v) for c, v in client_scores(last, score).items()}
    left_out = {str(c) for c in (result.novel_clients or []) + (result.attackers or [])}
    both = [(scores[c], own) for c, own in alone.items()
            if c in scores and c not in left_out and "model" in own]
    if not both:
        return []
    gains = [score.gain(mine, [own["model"]]) for mine, own in both]
    linear = [own["linear"] for _, own in both if "linear" in own]
    scale, unit = score.scale, "%" if score.higher_is_better else ""
    mean_run = sum(m for m, _ in both) / len(both)
    mean_alone = sum(own["model"] for _, own in both) / len(both)
    gain = score.gain(mean_run, [mean_alone])
    return [f"Each client alone, on the same test rows: the run's model trained on its own "
            f"rows for the same local steps scores {scale * mean_alone:.2f}{unit} on average"
            + (f" (a linear model {scale * sum(linear) / len(linear):.2f}{unit})" if linear
               else "") + "; this run's models" + ("" if federates else
                                                   " (each trained alone, no federation)")
            + f" {scale * mean_run:.2f}{unit} in round "
            f"{last.get('round')}: {scale * gain:+.2f}"
            f"{' points' if score.higher_is_better else ''}, better for "
            f"{sum(g > 0 for g in gains)} of {len(both)} clients"
            + ("" if gain >= 0 or not federates else " (federation does worse here)")]
