"""The SAM template as AWS reads it: what it declares (`template`, `function_spec`), its tables,
queues and buckets made on an endpoint (`provision`), and what Lambda hands a function from its
event sources (`events`: stream records, FilterCriteria).

The local stack runs from it, the tests provision their moto from it, and the build check reads
the built template with it. None of it ships to Lambda.
"""
