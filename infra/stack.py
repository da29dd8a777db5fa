"""The template is what the code needs: translates template.yaml offline (the SAM translator, as `sam validate` does),
checks in the translated template what moto does not model (the HTTP API's routes and authorizers, throttling, the
table's TTL, the event source's concurrency, the policies), then creates the stack on moto's CloudFormation and
prints, as shell assignments, the table and the queues it made, for the test suites to run against.

Usage: python infra/stack.py ENDPOINT_URL [TEMPLATE]
"""

import ast
import json
import os
import sys
import tempfile
import time

import boto3
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

# The managed policies SAM attaches, by name, resolved offline (sam validate does the same).
MANAGED_POLICIES = {
    name: f"arn:aws:iam::aws:policy/service-role/{name}"
    for name in ["AWSLambdaBasicExecutionRole", "AWSLambdaSQSQueueExecutionRole"]
} | {"AWSXrayWriteOnlyAccess": "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess"}

CODE_BUCKET = "onejob-code"
CODE_KEY = "bootstrap.zip"
PARAMETERS = {
    "JwtIssuer": "https://auth.example.com/",
    "JwtAudience": "onejob",
    "ProviderKeysSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:onejob-keys-AbCdEf",
    "AlarmTopicArn": "arn:aws:sns:us-east-1:123456789012:onejob-alarms",
    "EventBusName": "onejob-settled",
    # What `onejob check` prints for examples/team/onejob.toml's Bedrock provider, in us-east-1.
    "BedrockModelArns": ",".join([
        "arn:aws:bedrock:us-east-1:*:inference-profile/us.anthropic.claude-haiku-4-5-20251001-v1:0",
        "arn:aws:bedrock:*::foundation-model/anthropic.claude-haiku-4-5-20251001-v1:0",
    ]),
}

# The provider keys the stack's secret holds: those examples/team/onejob.toml names.
TEAM_KEYS = {"OPENAI_API_KEY": "sk-team-openai"}


class PolicyLoader:
    def load(self):
        return MANAGED_POLICIES


def translate(path):
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(path) as f:
        template = yaml_parse(f.read())
    # The functions' code and the config layer are built by `sam build`; here each is an object put into moto's S3.
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            resource.setdefault("Properties", {})["CodeUri"] = f"s3://{CODE_BUCKET}/{CODE_KEY}"
        if resource["Type"] == "AWS::Serverless::LayerVersion":
            resource["Properties"]["ContentUri"] = f"s3://{CODE_BUCKET}/{CODE_KEY}"
    template["Globals"]["Function"]["CodeUri"] = f"s3://{CODE_BUCKET}/{CODE_KEY}"
    return transform(template, PARAMETERS, PolicyLoader())


def of_type(template, kind):
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def check(template):
    """What the stack must hold that moto does not model; each failure names what the code relies on."""
    problems = []

    def expect(ok, what):
        if not ok:
            problems.append(what)

    (table,) = of_type(template, "AWS::DynamoDB::Table").values()
    ttl = table["Properties"].get("TimeToLiveSpecification", {})
    expect(ttl == {"AttributeName": "expires_at", "Enabled": True}, f"the table's TTL is on expires_at: {ttl}")
    expect(table.get("DeletionPolicy") == "Retain" and table.get("UpdateReplacePolicy") == "Retain",
           "the table is retained on stack delete and replacement")
    expect(table["Properties"].get("DeletionProtectionEnabled") is True, "the table has deletion protection")

    # SAM writes the HTTP API's routes as an OpenAPI body: each route's `security` names its authorizer.
    (api,) = of_type(template, "AWS::ApiGatewayV2::Api").values()
    body = api["Properties"]["Body"]
    security = {f"{method} {path}": op.get("security") for path, ops in body["paths"].items() for method, op in ops.items()}
    for route in ["get /", "get /assets/{file}", "get /healthz", "get /openapi.json"]:
        expect(security.get(route) == [{"NONE": []}], f"{route} is routed without the authorizer: {security.get(route)}")
    proxy = security.get("x-amazon-apigateway-any-method /{proxy+}")
    expect(proxy == [{"JwtAuthorizer": []}], f"every other route demands the JWT authorizer: {proxy}")
    scheme = body["components"]["securitySchemes"]["JwtAuthorizer"]["x-amazon-apigateway-authorizer"]
    expect(scheme["type"] == "jwt" and scheme["identitySource"] == "$request.header.Authorization",
           f"the authorizer checks the bearer JWT: {scheme}")
    stages = list(of_type(template, "AWS::ApiGatewayV2::Stage").values())
    throttled = [s["Properties"].get("DefaultRouteSettings", {}) for s in stages]
    expect(any("ThrottlingRateLimit" in t and "ThrottlingBurstLimit" in t for t in throttled),
           f"the API's stage is throttled: {throttled}")

    functions = of_type(template, "AWS::Lambda::Function")
    (config_layer,) = of_type(template, "AWS::Lambda::LayerVersion")
    for name, function in functions.items():
        props = function["Properties"]
        expect(props.get("TracingConfig", {}).get("Mode") == "Active", f"{name} is traced")
        env = props["Environment"]["Variables"]
        for var in ["ONEJOB_TABLE", "ONEJOB_QUEUE_URL", "ONEJOB_SECRET_ARN", "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "ONEJOB_EVENT_BUS"]:
            expect(var in env, f"{name} gets {var}")
        expect(env.get("ONEJOB_CONFIG") == "/opt/onejob.toml", f"{name} reads the config layer's onejob.toml")
        layers = props.get("Layers", [])
        expect(layers[:1] == [{"Ref": config_layer}], f"{name} runs with the config layer: {layers}")
        expect(layers[1:] == [{"Fn::If": ["HasAdotLayer", {"Ref": "AdotLayerArn"}, {"Ref": "AWS::NoValue"}]}],
               f"{name} runs the ADOT collector layer when given: {layers}")
        vpc = props.get("VpcConfig")
        expected = {"Fn::If": ["InVpc", {"SubnetIds": {"Ref": "SubnetIds"}, "SecurityGroupIds": {"Ref": "SecurityGroupIds"}},
                               {"Ref": "AWS::NoValue"}]} if name == "WorkerFunction" else None
        expect(vpc == expected, f"{name} runs in the VPC the parameters name, if it calls providers: {vpc}")
    mappings = list(of_type(template, "AWS::Lambda::EventSourceMapping").values())
    expect(len(mappings) == 1 and mappings[0]["Properties"].get("ScalingConfig", {}).get("MaximumConcurrency"),
           "the worker's SQS event source caps its concurrency")
    expect(mappings and mappings[0]["Properties"].get("FunctionResponseTypes") == ["ReportBatchItemFailures"],
           "the worker reports partial batch failures")

    roles = of_type(template, "AWS::IAM::Role")
    # A role's own policies, and the policies of their own that name it (made under a condition: the parameters
    # above give the secret and the bus, so they all are).
    policies = {name: list(role["Properties"].get("Policies", [])) for name, role in roles.items()}
    for policy in of_type(template, "AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            policies[role["Ref"]].append(policy["Properties"])
    statements = {name: [s for p in found for s in p["PolicyDocument"]["Statement"]] for name, found in policies.items()}
    for name, found in statements.items():
        actions = {a for s in found for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
        if "dynamodb:UpdateItem" in actions:
            expect({"dynamodb:GetItem", "dynamodb:PutItem"} <= actions,
                   f"{name} may read and put an item (guarded full writes): {sorted(actions)}")
        secrets = [s for s in found if "secretsmanager:GetSecretValue" in json.dumps(s["Action"])]
        for s in secrets:
            expect(s["Resource"] == {"Ref": "ProviderKeysSecretArn"},
                   f"{name} reads the provider keys' secret only: {s['Resource']}")
    readers = {name for name, found in statements.items()
               if any("secretsmanager" in json.dumps(s["Action"]) for s in found)}
    callers = {functions[f]["Properties"]["Role"]["Fn::GetAtt"][0] for f in ["WorkerFunction", "SweeperFunction"]}
    expect(readers == callers, f"the functions that call providers, and they alone, read their keys: {sorted(readers)}")
    putters = {name: [s for s in found if "events:PutEvents" in json.dumps(s["Action"])]
               for name, found in statements.items()}
    putters = {name: found for name, found in putters.items() if found}
    expect(list(putters) == [functions["SweeperFunction"]["Properties"]["Role"]["Fn::GetAtt"][0]],
           f"the sweeper alone may put events: {sorted(putters)}")
    for found in putters.values():
        expect(all("event-bus/${EventBusName}" in json.dumps(s["Resource"]) for s in found),
               f"on the named bus only: {[s['Resource'] for s in found]}")

    invokers = {name: [s for s in found if "bedrock" in json.dumps(s["Action"])] for name, found in statements.items()}
    invokers = {name: found for name, found in invokers.items() if found}
    expect(set(invokers) == callers,
           f"the functions that call providers, and they alone, may invoke Bedrock: {sorted(invokers)}")
    for found in invokers.values():
        expect(all(s["Action"] == ["bedrock:InvokeModel"] and s["Resource"] == {"Ref": "BedrockModelArns"}
                   for s in found), f"only InvokeModel, on the configured models only: {found}")

    queues = of_type(template, "AWS::SQS::Queue")
    timeout = functions["WorkerFunction"]["Properties"]["Timeout"]
    attempts = queues["AttemptsQueue"]["Properties"]
    expect(attempts["VisibilityTimeout"] >= 6 * timeout,
           f"a message is not redelivered while a worker may still listen: {attempts['VisibilityTimeout']} s "
           f"< 6 x the worker's {timeout} s")
    expect(attempts["RedrivePolicy"]["maxReceiveCount"] >= 3, "a message is tried a few times before the dead letters")

    alarms = of_type(template, "AWS::CloudWatch::Alarm")
    metrics = {a["Properties"]["MetricName"] for a in alarms.values()}
    for metric in ["ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage", "Errors", "Throttles",
                   "5xx", "onejob_races_lost_total", "onejob_attempts_total"]:
        expect(metric in metrics, f"an alarm watches {metric}")
    logs = of_type(template, "AWS::Logs::LogGroup")
    expect(len(logs) == len(functions) and all("RetentionInDays" in g["Properties"] for g in logs.values()),
           "every function's log group keeps its logs for a set time")
    return problems


def create(endpoint, template):
    session = boto3.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
    s3 = session.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket=CODE_BUCKET)
    s3.put_object(Bucket=CODE_BUCKET, Key=CODE_KEY, Body=b"not run")
    cloudformation = session.client("cloudformation", endpoint_url=endpoint)
    name = f"onejob-{int(time.time() * 1000)}"
    # The provider keys' secret, as docs/deploy.md's first step makes it (the keys the example team folder names).
    secrets = session.client("secretsmanager", endpoint_url=endpoint)
    keys = secrets.create_secret(Name=f"{name}-provider-keys", SecretString=json.dumps(TEAM_KEYS))
    parameters = PARAMETERS | {"ProviderKeysSecretArn": keys["ARN"]}
    cloudformation.create_stack(
        StackName=name,
        TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    for _ in range(300):
        stack = cloudformation.describe_stacks(StackName=name)["Stacks"][0]
        if stack["StackStatus"] != "CREATE_IN_PROGRESS":
            break
        time.sleep(0.2)
    if stack["StackStatus"] != "CREATE_COMPLETE":
        raise SystemExit(f"infra/stack.py: the stack is {stack['StackStatus']}: {stack.get('StackStatusReason')}")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    # The grant as IAM holds it: the models the parameter lists, no more.
    iam = session.client("iam", endpoint_url=endpoint)
    worker_role = next(r["PhysicalResourceId"] for r in cloudformation.describe_stack_resources(StackName=name)
                       ["StackResources"] if r.get("LogicalResourceId") == "WorkerFunctionRole")
    granted = iam.get_role_policy(RoleName=worker_role, PolicyName="onejob-bedrock-models")["PolicyDocument"]
    if isinstance(granted, str):
        granted = json.loads(granted)
    resources = granted["Statement"][0]["Resource"]
    if sorted(resources) != sorted(parameters["BedrockModelArns"].split(",")):
        raise SystemExit(f"infra/stack.py: the worker may invoke {resources}, not the configured models")
    # What each function gets from the stack: its environment and its layers, as Lambda would run it.
    lambdas = session.client("lambda", endpoint_url=endpoint)
    resources = cloudformation.describe_stack_resources(StackName=name)["StackResources"]
    functions = {}
    for r in resources:
        if r.get("ResourceType") == "AWS::Lambda::Function":
            found = lambdas.get_function_configuration(FunctionName=r["PhysicalResourceId"])
            functions[r["LogicalResourceId"]] = {
                "environment": found.get("Environment", {}).get("Variables", {}),
                "layers": [layer["Arn"] for layer in found.get("Layers", [])],
                "grants": grants(iam, found["Role"].rsplit("/", 1)[-1], outputs["JobsTableName"]),
            }
    return outputs, functions


def grants(iam, role, table):
    """What a function's role may do, as IAM holds it: each allowed action with the resources it is allowed on,
    the table's named `table` and its indexes `index/<name>`, any other resource by its ARN."""
    def named(arn):
        prefix = f":table/{table}"
        if prefix not in arn:
            return arn
        rest = arn.split(prefix, 1)[1]
        return "table" if rest == "" else rest.lstrip("/")
    allowed = []
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        document = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        if isinstance(document, str):
            # moto keeps a stack's inline policy as Python's text of it, not JSON.
            try:
                document = json.loads(document)
            except json.JSONDecodeError:
                document = ast.literal_eval(document)
        for statement in document["Statement"]:
            if statement.get("Effect") != "Allow":
                continue
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            allowed.append({"actions": actions, "resources": [named(r) for r in resources]})
    return allowed


def main():
    endpoint = sys.argv[1]
    template = translate(sys.argv[2] if len(sys.argv) > 2 else "template.yaml")
    problems = check(template)
    if problems:
        for problem in problems:
            print(f"infra/stack.py: the template must hold: {problem}", file=sys.stderr)
        raise SystemExit(1)
    outputs, functions = create(endpoint, template)
    fd, path = tempfile.mkstemp(prefix="onejob-stack-functions-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(functions, f)
    print(f"ONEJOB_TEST_STACK_TABLE={outputs['JobsTableName']}")
    print(f"ONEJOB_TEST_STACK_FUNCTIONS={path}")
    print(f"ONEJOB_TEST_STACK_QUEUE_URL={outputs['AttemptsQueueUrl']}")
    print(f"ONEJOB_TEST_STACK_DLQ_URL={outputs['AttemptsDeadLetterQueueUrl']}")


if __name__ == "__main__":
    main()
