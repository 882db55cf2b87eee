"""The control layer between `sky/` and the rest of searchrl: one module per concern.

    skypilot.py        where SkyPilot lives (.venv-sky); re-running `searchrl sky ...` under it
    tasks.py           --env/--secret flags; sky/*.yaml through SkyPilot's own parser plus the checks it lacks
    endpoint.py        the readiness probe as SkyServe sends it; waiting for a service's endpoint
    launch.py          planning and launching the retrieval service and the trainer (health and corpus checks)
    smoke.py           `searchrl smoke`: download, serve, health-check, recall and a scripted eval of one corpus
    index_mount.py     mounting a prebuilt index bucket on the replicas
    tls.py             mounting the service.tls certificate (SEARCHRL_RETRIEVAL_CA_BUNDLE) on the training nodes
    replica_budget.py  how long a replica takes to start (the readiness probe's initial delay)

    searchrl sky validate                          # every sky/*.yaml through SkyPilot's own parser
    searchrl sky endpoint searchrl-retrieval       # wait for READY, print http://IP:PORT
    searchrl sky serve --env SEARCHRL_INDEX_BUCKET=my-index --secret RETRIEVAL_API_KEY   # replicas from a bucket
    searchrl sky train --dry-run --env CHECKPOINT_BUCKET=my-ckpts    # print the task, launch nothing
    searchrl sky train --env CHECKPOINT_BUCKET=my-ckpts --secret WANDB_API_KEY

Why this exists (../shared/DESIGN.md section 4): SkyPilot accepts a task whose probe header still says
`$RETRIEVAL_API_KEY` (a secret that was never passed is left as literal text, so the probe 401s forever), cannot
check accelerator names offline, and `sky serve status --endpoint` exits 0 when nothing is up. So we parse every
task with SkyPilot's real parser and add the checks it lacks.

SkyPilot 0.14.1 pins click 8.1.8, which conflicts with huggingface_hub and wandb in the main `.venv`, so it
lives in its own virtual environment `.venv-sky` (`make sky-venv`). Nothing here imports `sky` at module level
(the package is imported by the trainer and the CLI in `.venv`); the CLI is searchrl/cli/sky.py, the task files
are sky/*.yaml (YAML only, so `import sky` keeps meaning SkyPilot).
"""
