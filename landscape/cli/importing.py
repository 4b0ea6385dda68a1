"""``landscape import``: existing state_dict files of a federated run (the global model and each client's per
round) made a run directory that every pass, figure, comparison, report and claim reads."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("import")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="the run directory to make")
@click.option("--global", "global_files", required=True, metavar="PATTERN",
              help="the global model's file of each round, with {round}: e.g. ckpts/global/round-{round}.pt "
                   "(round 0 the initial model, round t the model after round t)")
@click.option("--clients", "client_files", metavar="PATTERN",
              help="each client's returned model of a round, with {round} and {client}: e.g. "
                   "ckpts/clients/round-{round}/client-{client}.pt")
@click.option("--start", metavar="previous|PATTERN",
              help="what the clients of a round started from: 'previous' (the previous round's global model, "
                   "as in FedAvg and FedSAM) or the files the server sent, with {round}; needed with --clients")
@click.option("--model", required=True, metavar="NAME|MODULE:FACTORY",
              help="the model: a registered name or package.module:factory (called with no arguments)")
@click.option("--data", required=True, metavar="NAME|MODULE:FACTORY",
              help="the training samples the partition indexes: a registered data set or package.module:factory "
                   "returning (inputs, targets), a Dataset or a DataLoader")
@click.option("--test-data", metavar="MODULE:FACTORY", help="the test samples, with a data factory")
@click.option("--partition", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="a JSON file of each client's sample indices: a partition.json, {\"0\": [...], ...} or "
                   "[[...], ...]")
@click.option("--algorithm", default="unknown", show_default=True, help="the algorithm's name, recorded")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="a hyper-parameter the run trained with, recorded: a training key (--set train.batch_size=20, "
                   "the minibatch size of the minibatch metrics; train.lr=0.1) or the algorithm's "
                   "(--set algorithm.rho=0.05). Repeatable")
@click.option("--overwrite", is_flag=True, help="replace a run this tool made at OUT")
@click.option("--quiet", is_flag=True, help="no progress bar")
def import_command(out: Path, global_files: str, client_files: str | None, start: str | None, model: str,
                   data: str, test_data: str | None, partition: Path, algorithm: str,
                   assignments: tuple[str, ...], overwrite: bool, quiet: bool) -> None:
    """Make a run directory (--out) from existing state_dict files, without training again: rounds and clients
    come from the file names (never from sorted position), the models are checked against --model, and the
    run reads as any other (`landscape analyze RUN --trust-imports` with the factories' modules on PYTHONPATH).
    An interrupted import continues where it stopped; a round imported again must hold the same models."""
    from landscape.core.progress import progress_bar
    from landscape.workflows.importing import hyperparameters, import_run

    bars = []  # the bar, made when the first round is written (nothing is shown for a refusal)

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(progress_bar(total=total, desc="import", unit="round", disable=quiet, dynamic_ncols=True))
        bars[0].update(done - bars[0].n)

    try:
        report = import_run(out, global_files=global_files, client_files=client_files, start=start, model=model,
                            data=data, test_data=test_data, partition=partition, algorithm=algorithm,
                            hyperparameters=hyperparameters(assignments), overwrite=overwrite, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    with_clients = len(report.clients)
    click.echo(f"imported {len(report.rounds)} round{'s' * (len(report.rounds) != 1)} into {out} "
               f"({with_clients} with client models): landscape analyze {out} --trust-imports")
