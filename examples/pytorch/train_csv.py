"""Rating prediction from a CSV file through tessera.torch and a torch DataLoader.

The data: MovieLens `ratings.csv` (userId,movieId,rating,timestamp) and, beside it,
`movies.csv` (movieId,title,genres), read in place from ../shared/data/ml-latest-small
relative to the repository (or --ratings=PATH); without it the script says so and exits 0,
or with --generate writes a CSV of the same columns from a planted low-rank model to a temp
file and trains on that.

The model: rating = mean + <u, m + g> + b_u + b_m, where u is the user's row, m the movie's,
g the mean of the movie's genres' rows (a bag per movie, mean pooling), b_u and b_m
one-float rows. All rows live in Tessera sparse tables (Adagrad on the servers) behind one
`tessera.torch.EmbeddingBagCollection`; there are no torch parameters at all. A DataLoader
(shuffled, 2 worker processes) yields batches of `Bags`; `PrefetchLoader` pulls the next
batch's rows while this one trains. Each epoch ends with the test RMSE (a seeded 10% of the
ratings) next to the RMSE of always predicting the training mean.

    bash examples/pytorch/run_local.sh train_csv.py
    bash examples/pytorch/run_local.sh train_csv.py --generate
"""

import argparse
import csv
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

import tessera
import tessera.torch as tt

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_RATINGS = os.path.join(HERE, "..", "..", "..", "shared", "data", "ml-latest-small",
                               "ratings.csv")


def read_csv(ratings_path):
    """Columns of ratings.csv and, if movies.csv is beside it, each movie's genre names."""
    users, movies, ratings = [], [], []
    with open(ratings_path, newline="") as f:
        for row in csv.DictReader(f):
            users.append(int(row["userId"]))
            movies.append(int(row["movieId"]))
            ratings.append(float(row["rating"]))
    genres = {}
    movies_path = os.path.join(os.path.dirname(ratings_path), "movies.csv")
    if os.path.exists(movies_path):
        with open(movies_path, newline="") as f:
            for row in csv.DictReader(f):
                genres[int(row["movieId"])] = [g for g in row["genres"].split("|")
                                               if g and g != "(no genres listed)"]
    return (np.array(users, np.int64), np.array(movies, np.int64),
            np.array(ratings, np.float32), genres)


def generate_csv(path, n=100000, num_users=600, num_movies=3000, rank=4, seed=1):
    """A ratings.csv / movies.csv pair from a planted model (ratings 0.5..5 in halves)."""
    rng = np.random.default_rng(seed)
    u, m = rng.normal(0, 0.6, (num_users, rank)), rng.normal(0, 0.6, (num_movies, rank))
    bu, bm = rng.normal(0, 0.3, num_users), rng.normal(0, 0.4, num_movies)
    users = rng.integers(1, num_users + 1, n)
    movies = (rng.zipf(1.3, n) % num_movies) + 1
    r = 3.5 + (u[users - 1] * m[movies - 1]).sum(1) + bu[users - 1] + bm[movies - 1]
    r = np.clip(np.round((r + rng.normal(0, 0.5, n)) * 2) / 2, 0.5, 5.0)
    with open(path, "w") as f:
        f.write("userId,movieId,rating,timestamp\n")
        for a, b, c in zip(users, movies, r):
            f.write("%d,%d,%.1f,0\n" % (a, b, c))
    names = ["Action", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi"]
    with open(os.path.join(os.path.dirname(path), "movies.csv"), "w") as f:
        f.write("movieId,title,genres\n")
        for i in range(1, num_movies + 1):
            f.write("%d,movie %d,%s\n" % (i, i, "|".join(names[j] for j in range(6)
                                                         if (i >> j) & 1)))


class Ratings(torch.utils.data.Dataset):
    """One sample per rating: (user, movie, rating, the movie's genre ids)."""

    def __init__(self, users, movies, ratings, movie_genres):
        self.users, self.movies, self.ratings = users, movies, ratings
        self.movie_genres = movie_genres

    def __len__(self):
        return len(self.ratings)

    def __getitem__(self, i):
        m = int(self.movies[i])
        return int(self.users[i]), m, float(self.ratings[i]), self.movie_genres.get(m, ())


def collate(samples):
    """A batch: the features as Bags (one key per bag for users and movies; each movie's
    genres as one bag, empty for a movie without any) and the ratings."""
    users, movies, ratings, genres = zip(*samples)
    ones = torch.ones(len(samples), dtype=torch.int64)
    lengths = torch.tensor([len(g) for g in genres], dtype=torch.int64)
    genre_keys = torch.tensor([k for g in genres for k in g], dtype=torch.int64)
    user_keys, movie_keys = torch.tensor(users), torch.tensor(movies)
    return {"user": tt.Bags(user_keys, lengths=ones),
            "movie": tt.Bags(movie_keys, lengths=ones),
            "genres": tt.Bags(genre_keys, lengths=lengths),
            "user_bias": tt.Bags(user_keys, lengths=ones),
            "movie_bias": tt.Bags(movie_keys, lengths=ones)}, torch.tensor(ratings)


class RatingModel(torch.nn.Module):
    def __init__(self, client, dim, lr, mean, prefix):
        super().__init__()
        adagrad = tessera.OptimizerSpec("adagrad", learning_rate=lr, initial_accumulator=0.1)
        small = tessera.InitializerSpec("normal", a=0.0, b=0.05, seed=3)
        self.mean = mean
        self.tables = tt.EmbeddingBagCollection(client, [
            tt.TableConfig(prefix + "/user", dim, ["user"], adagrad, small),
            tt.TableConfig(prefix + "/movie", dim, ["movie"], adagrad, small),
            tt.TableConfig(prefix + "/genre", dim, ["genres"], adagrad, small, pooling="mean"),
            tt.TableConfig(prefix + "/bias", 1, ["user_bias", "movie_bias"], adagrad)])

    def forward(self, features):
        e = self.tables(features)
        item = e["movie"] + e["genres"]
        return (self.mean + (e["user"] * item).sum(1) + e["user_bias"][:, 0] +
                e["movie_bias"][:, 0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", required=True, help="host:port,... of the Tessera servers")
    ap.add_argument("--ratings", default=DEFAULT_RATINGS, help="MovieLens ratings.csv")
    ap.add_argument("--generate", action="store_true",
                    help="train on a generated CSV (in a temp dir) instead")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--loader_workers", type=int, default=2)
    ap.add_argument("--table_prefix", default="csv")
    args = ap.parse_args()

    tmp = None
    if args.generate:
        tmp = tempfile.TemporaryDirectory(prefix="tessera-csv-")
        args.ratings = os.path.join(tmp.name, "ratings.csv")
        generate_csv(args.ratings)
    elif not os.path.exists(args.ratings):
        print("train_csv: skipped: no %s (MovieLens ml-latest-small; or run with --generate)" %
              os.path.normpath(args.ratings))
        return 0
    users, movies, ratings, genre_names = read_csv(args.ratings)
    vocab = {g: i for i, g in enumerate(sorted({g for gs in genre_names.values() for g in gs}))}
    movie_genres = {m: tuple(vocab[g] for g in gs) for m, gs in genre_names.items()}
    order = np.random.default_rng(7).permutation(len(ratings))
    cut = len(ratings) // 10
    test, train = order[:cut], order[cut:]
    print("train_csv: %s: %d ratings, %d users, %d movies, %d genres (test: %d)" %
          (os.path.normpath(args.ratings), len(ratings), len(np.unique(users)),
           len(np.unique(movies)), len(vocab), cut))

    torch.manual_seed(1)
    mean = float(ratings[train].mean())
    loader = torch.utils.data.DataLoader(
        Ratings(users[train], movies[train], ratings[train], movie_genres),
        batch_size=args.batch_size, shuffle=True, collate_fn=collate,
        num_workers=args.loader_workers)
    test_loader = torch.utils.data.DataLoader(
        Ratings(users[test], movies[test], ratings[test], movie_genres),
        batch_size=4096, collate_fn=collate)
    client = tessera.Client(args.servers)
    model = RatingModel(client, args.dim, args.lr, mean, args.table_prefix)
    baseline = float(np.sqrt(((ratings[test] - mean) ** 2).mean()))

    rmse = None
    for epoch in range(args.epochs):
        t0, n, sq = time.monotonic(), 0, 0.0
        for features, y in tt.PrefetchLoader(loader, model.tables, features=lambda b: b[0]):
            err = model(features) - y
            loss = (err * err).sum()
            loss.backward()  # the rows' gradients go to the servers' Adagrad
            n += len(y)
            sq += float(loss)
        model.tables.wait_pushes()
        with torch.no_grad():
            errs = torch.cat([model(f) - y for f, y in test_loader])
        rmse = float(errs.pow(2).mean().sqrt())
        print("epoch %d train rmse %.4f test rmse %.4f (mean-only %.4f) %.0f samples/s" %
              (epoch + 1, np.sqrt(sq / n), rmse, baseline, n / (time.monotonic() - t0)),
              flush=True)
    print(json.dumps({"data": os.path.basename(args.ratings), "generated": args.generate,
                      "ratings": int(len(ratings)), "epochs": args.epochs,
                      "test_rmse": round(rmse, 4), "mean_only_rmse": round(baseline, 4)}))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
