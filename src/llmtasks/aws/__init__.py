"""The adapters: the only code that talks to DynamoDB, SQS and S3 (boto3), each turning
botocore's failures into domain errors."""
