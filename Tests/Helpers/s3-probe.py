"""The tests' own S3 client (boto3, independent of userstored's): make buckets and look into them.

usage: s3-probe.py ENDPOINT ready | create-bucket NAME | list BUCKET [PREFIX] | sizes BUCKET [PREFIX] | put BUCKET KEY...
       | move BUCKET FROM TO (every object under prefix FROM to prefix TO: copied, then deleted)
       | get BUCKET KEY FILE (the object's bytes into FILE)
Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY."""
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, command, *rest = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10))
if command == "ready":
    # Answering and writable (a restarted SeaweedFS lists before its volumes take writes); a
    # refusal of the credentials is an answer too (a test revoked them).
    try:
        if "ready" not in [bucket["Name"] for bucket in s3.list_buckets().get("Buckets", [])]:
            s3.create_bucket(Bucket="ready")
        s3.put_object(Bucket="ready", Key="probe", Body=b"")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
            raise
elif command == "create-bucket":
    s3.create_bucket(Bucket=rest[0])
elif command == "list":
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=rest[0], Prefix=rest[1] if len(rest) > 1 else ""):
        for item in page.get("Contents", []):
            print(item["Key"])
elif command == "sizes":
    # Every object under PREFIX with its size ("KEY SIZE" lines): what a bench counts as uploaded.
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=rest[0], Prefix=rest[1] if len(rest) > 1 else ""):
        for item in page.get("Contents", []):
            print(item["Key"], item["Size"])
elif command == "put":
    for key in rest[1:]:
        s3.put_object(Bucket=rest[0], Key=key, Body=key.encode())
elif command == "get":
    bucket, key, path = rest
    with open(path, "wb") as file:
        file.write(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
elif command == "move":
    bucket, source, target = rest
    keys = [item["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=source)
            for item in page.get("Contents", [])]
    for key in keys:
        s3.copy_object(Bucket=bucket, Key=target + key[len(source):], CopySource={"Bucket": bucket, "Key": key})
    for start in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in keys[start:start + 1000]]})
    print(len(keys))
else:
    sys.exit(f"unknown command {command}")
