package scrutiny.peers;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.transaction.Transaction;

/**
 * Pulsar's own Java client writing and acknowledging in transactions, for scrutiny's tests
 * (scrutiny/testing/realpulsar.py): the Python client has none. One command a run, one JSON line on stdout.
 *
 *   produce URL TOPIC PRODUCER FIRST_ID TXN...   each TXN is cN (N messages, committed) or aN (aborted), in order;
 *                                                the messages' sequence ids count up from FIRST_ID:
 *                                                {"committed": messages, "aborted": messages, "next_id": id}
 *   acknowledge URL TOPIC SUBSCRIPTION N c|a     N messages received from the earliest and acknowledged in one
 *                                                transaction, committed or aborted: {"acknowledged": N}
 */
public final class TransactionTool {
    public static void main(String[] args) throws Exception {
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[1]).enableTransaction(true)
                .operationTimeout(60, TimeUnit.SECONDS).build()) {
            String out = switch (args[0]) {
                case "produce" -> produce(client, args[2], args[3], Long.parseLong(args[4]),
                                          List.of(args).subList(5, args.length));
                case "acknowledge" -> acknowledge(client, args[2], args[3], Integer.parseInt(args[4]),
                                                  args[5].equals("c"));
                default -> throw new IllegalArgumentException("unknown command " + args[0]);
            };
            System.out.println(out);
        }
    }

    static Transaction begin(PulsarClient client) throws Exception {
        return client.newTransaction().withTransactionTimeout(5, TimeUnit.MINUTES).build().get();
    }

    static String produce(PulsarClient client, String topic, String name, long id, List<String> txns)
            throws Exception {
        long committed = 0, aborted = 0;
        try (Producer<byte[]> producer = client.newProducer().topic(topic).producerName(name)
                .enableBatching(false).sendTimeout(0, TimeUnit.SECONDS).create()) {
            for (String spec : txns) {
                int n = Integer.parseInt(spec.substring(1));
                Transaction txn = begin(client);
                List<java.util.concurrent.CompletableFuture<?>> sent = new ArrayList<>();
                for (int i = 0; i < n; i++, id++) {
                    sent.add(producer.newMessage(txn).sequenceId(id)
                            .value(("txn message " + id).getBytes(StandardCharsets.UTF_8)).sendAsync());
                }
                for (var f : sent) {
                    f.get();
                }
                if (spec.charAt(0) == 'c') {
                    txn.commit().get();
                    committed += n;
                } else {
                    txn.abort().get();
                    aborted += n;
                }
            }
        }
        return "{\"committed\": " + committed + ", \"aborted\": " + aborted + ", \"next_id\": " + id + "}";
    }

    static String acknowledge(PulsarClient client, String topic, String subscription, int n, boolean commit)
            throws Exception {
        try (Consumer<byte[]> consumer = client.newConsumer().topic(topic).subscriptionName(subscription)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe()) {
            Transaction txn = begin(client);
            for (int i = 0; i < n; i++) {
                Message<byte[]> m = consumer.receive(60, TimeUnit.SECONDS);
                if (m == null) {
                    throw new IllegalStateException("received " + i + " of " + n);
                }
                consumer.acknowledgeAsync(m.getMessageId(), txn).get();
            }
            if (commit) {
                txn.commit().get();
            } else {
                txn.abort().get();
            }
        }
        return "{\"acknowledged\": " + n + "}";
    }
}
