"""`python -m lair_client generate --target HOST:PORT "text"` and friends."""

import argparse
import sys

import grpc

from lair_client.client import LairClient


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lair_client", description="LAIR gRPC client")
    parser.add_argument("--target", default="localhost:50051")
    parser.add_argument("--api-key")
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate a completion")
    generate.add_argument("prompt")
    generate.add_argument("--model", default="")
    generate.add_argument("--max-tokens", type=int, default=32)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int)
    generate.add_argument("--stop", action="append", default=[])
    generate.add_argument("--stream", action="store_true")
    tokenize = commands.add_parser("tokenize", help="print token ids")
    tokenize.add_argument("text")
    commands.add_parser("models", help="list served models")
    args = parser.parse_args(argv)

    client = LairClient(args.target, api_key=args.api_key, timeout=args.timeout)
    try:
        if args.command == "generate":
            sampling = dict(max_tokens=args.max_tokens, temperature=args.temperature, stop=args.stop)
            if args.seed is not None:
                sampling["seed"] = args.seed
            if args.stream:
                for message in client.generate_stream(args.prompt, args.model, **sampling):
                    sys.stdout.write(message.text)
                    sys.stdout.flush()
                sys.stdout.write("\n")
            else:
                print(client.generate(args.prompt, args.model, **sampling).completions[0].text)
        elif args.command == "tokenize":
            print(" ".join(str(i) for i in client.tokenize(args.text).token_ids))
        else:
            for model in client.list_models().models:
                print(model.id)
    except grpc.RpcError as error:
        print(f"error: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
