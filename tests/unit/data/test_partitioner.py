from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from kafka2pc._data.partitioner import key_partition, key_partitions, murmur2


@settings(max_examples=3000)
@given(st.binary(max_size=64))
def test_murmur2_equals_kafka_pythons(data):
    assert murmur2(data) == kafka_python_murmur2(data) & 0xFFFFFFFF


def test_partitions_of_the_java_client():
    # org.apache.kafka.common.utils.UtilsTest.testMurmur2: these keys hash to these (signed) ints in Java
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}
    for key, java in cases.items():
        assert murmur2(key) == java & 0xFFFFFFFF
        assert key_partition(key, 7) == (java & 0x7FFFFFFF) % 7
    assert key_partitions(list(cases), 7) == [key_partition(k, 7) for k in cases]
