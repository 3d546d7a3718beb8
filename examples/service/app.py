"""The trainbus training service with a job of your own.

Run it:  python examples/service/app.py --port 8000
   (or:  uvicorn examples.service.app:app --port 8000 --timeout-graceful-shutdown 5)
Then:    curl --json '{"epochs": 3, "width": 64}' localhost:8000/jobs
         curl -N localhost:8000/jobs/<id>/events
         curl localhost:8000/jobs/<id>
         curl -X DELETE localhost:8000/jobs/<id>

``python -m trainbus.serve`` serves the built-in demo job the same way.
"""

from __future__ import annotations

import argparse

import torch

import trainbus
from trainbus.serve import JobContext, create_app, create_server


def regression_job(ctx: JobContext) -> trainbus.Trainer:
    """Fit y = 3x - 1 with a small MLP; parameters: ``epochs``, ``width``, ``batches``."""
    epochs = int(ctx.params.get("epochs", 2))
    width = int(ctx.params.get("width", 32))
    batches = int(ctx.params.get("batches", 20))
    if not (1 <= epochs <= 100 and 1 <= width <= 1024 and 1 <= batches <= 10_000):
        raise ValueError("epochs (1-100), width (1-1024) and batches (1-10000) are out of range")
    x = torch.linspace(-1, 1, batches * 16).unsqueeze(1)
    data = torch.utils.data.TensorDataset(x, 3 * x - 1)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    )
    return trainbus.Trainer(
        model,
        loader,
        f"{epochs}ep",
        loss_fn=torch.nn.functional.mse_loss,
        loggers=ctx.loggers,  # the job's EventStream, latest metrics and watch: required
    )


app = create_app(regression_job, max_running=2)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the trainbus service with a regression job")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    try:
        create_server(app, host=args.host, port=args.port, log_level="info").run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
