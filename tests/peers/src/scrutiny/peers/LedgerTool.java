package scrutiny.peers;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.BookKeeper.DigestType;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

/**
 * BookKeeper's own client, driven line by line by scrutiny's tests (scrutiny/testing/realbookkeeper.py): one
 * command a line on stdin, one JSON object a line on stdout. Every ledger it writes has the password
 * "scrutiny" and entries whose payload says which ledger and entry they are, so that a test can tell them
 * apart. Commands (DIGEST: CRC32, CRC32C, MAC, DUMMY; KEY=VALUE: the ledger's custom metadata):
 *
 *   create E WQ AQ DIGEST ENTRIES SIZE [KEY=VALUE ...]   a ledger written and closed: {"ledger", "last"}
 *   open E WQ AQ DIGEST [KEY=VALUE ...]                  a ledger kept open for adds: {"ledger"}
 *   add LEDGER COUNT SIZE                                 entries added to an open ledger: {"last"}
 *   addasync LEDGER COUNT SIZE                            entries sent, not waited for: {"sent"}
 *   wait LEDGER                                           until every add sent is answered: {"last", "failed"}
 *   close LEDGER                                          {"last"}
 *   recover LEDGER                                        opened by a second client, recovered and fenced: {"last"}
 *   read LEDGER FIRST LAST                                read through the client (digests verified): {"entries"}
 *   delete LEDGER                                         {}
 *   quit
 */
public final class LedgerTool {
    static final byte[] PASSWORD = "scrutiny".getBytes(StandardCharsets.UTF_8);

    private final BookKeeper writer;
    private final BookKeeper recoverer;  // a second client: opening with recovery fences the writer's handle
    private final Map<Long, LedgerHandle> open = new ConcurrentHashMap<>();
    private final Map<Long, Pending> pending = new ConcurrentHashMap<>();

    /** Adds sent without waiting: how many are in flight, the last acknowledged, the first error. */
    static final class Pending {
        final AtomicInteger inFlight = new AtomicInteger();
        final AtomicLong last = new AtomicLong(-1);
        final AtomicReference<String> failed = new AtomicReference<>();
    }

    LedgerTool(String metadataServiceUri) throws Exception {
        writer = new BookKeeper(config(metadataServiceUri));
        recoverer = new BookKeeper(config(metadataServiceUri));
    }

    static ClientConfiguration config(String uri) {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setZkTimeout(10000);
        conf.setAddEntryTimeout(10);
        conf.setReadEntryTimeout(10);
        return conf;
    }

    static DigestType digest(String name) {
        return DigestType.valueOf(name);
    }

    static byte[] payload(long ledgerId, long entryId, int size) {
        byte[] stamp = ("ledger " + ledgerId + " entry " + entryId + ";").getBytes(StandardCharsets.UTF_8);
        byte[] out = new byte[Math.max(size, stamp.length)];
        for (int i = 0; i < out.length; i++) {
            out[i] = stamp[i % stamp.length];
        }
        return out;
    }

    static Map<String, byte[]> customMetadata(String[] args, int from) {
        Map<String, byte[]> out = new HashMap<>();
        for (int i = from; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("custom metadata is KEY=VALUE, not " + args[i]);
            }
            out.put(args[i].substring(0, eq), args[i].substring(eq + 1).getBytes(StandardCharsets.UTF_8));
        }
        return out;
    }

    LedgerHandle handle(String id) {
        LedgerHandle lh = open.get(Long.parseLong(id));
        if (lh == null) {
            throw new IllegalArgumentException("no open ledger " + id + " in this client");
        }
        return lh;
    }

    String run(String[] a) throws Exception {
        switch (a[0]) {
            case "create": {
                LedgerHandle lh = writer.createLedger(Integer.parseInt(a[1]), Integer.parseInt(a[2]),
                        Integer.parseInt(a[3]), digest(a[4]), PASSWORD, customMetadata(a, 7));
                int entries = Integer.parseInt(a[5]);
                int size = Integer.parseInt(a[6]);
                for (int e = 0; e < entries; e++) {
                    lh.addEntry(payload(lh.getId(), e, size));
                }
                lh.close();
                return "{\"ledger\": " + lh.getId() + ", \"last\": " + lh.getLastAddConfirmed() + "}";
            }
            case "open": {
                LedgerHandle lh = writer.createLedger(Integer.parseInt(a[1]), Integer.parseInt(a[2]),
                        Integer.parseInt(a[3]), digest(a[4]), PASSWORD, customMetadata(a, 5));
                open.put(lh.getId(), lh);
                return "{\"ledger\": " + lh.getId() + "}";
            }
            case "add": {
                LedgerHandle lh = handle(a[1]);
                int count = Integer.parseInt(a[2]);
                int size = Integer.parseInt(a[3]);
                long last = -1;
                for (int i = 0; i < count; i++) {
                    last = lh.addEntry(payload(lh.getId(), lh.getLastAddPushed() + 1, size));
                }
                return "{\"last\": " + last + "}";
            }
            case "addasync": {
                LedgerHandle lh = handle(a[1]);
                Pending p = pending.computeIfAbsent(lh.getId(), k -> new Pending());
                int count = Integer.parseInt(a[2]);
                int size = Integer.parseInt(a[3]);
                for (int i = 0; i < count; i++) {
                    p.inFlight.incrementAndGet();
                    lh.asyncAddEntry(payload(lh.getId(), lh.getLastAddPushed() + 1, size), (rc, h, entryId, ctx) -> {
                        if (rc == BKException.Code.OK) {
                            p.last.accumulateAndGet(entryId, Math::max);
                        } else {
                            p.failed.compareAndSet(null, BKException.getMessage(rc));
                        }
                        p.inFlight.decrementAndGet();
                    }, null);
                }
                return "{\"sent\": " + count + "}";
            }
            case "wait": {
                Pending p = pending.remove(Long.parseLong(a[1]));
                if (p == null) {
                    return "{\"last\": -1, \"failed\": null}";
                }
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
                while (p.inFlight.get() > 0 && System.nanoTime() < deadline) {
                    Thread.sleep(10);
                }
                String failed = p.failed.get();
                return "{\"last\": " + p.last.get() + ", \"failed\": "
                        + (failed == null ? "null" : quote(failed)) + "}";
            }
            case "close": {
                LedgerHandle lh = open.remove(Long.parseLong(a[1]));
                if (lh == null) {
                    throw new IllegalArgumentException("no open ledger " + a[1]);
                }
                lh.close();
                return "{\"last\": " + lh.getLastAddConfirmed() + "}";
            }
            case "recover": {
                LedgerHandle lh = recoverer.openLedger(Long.parseLong(a[1]), digestOf(a[1]), PASSWORD);
                long last = lh.getLastAddConfirmed();
                lh.close();
                return "{\"last\": " + last + "}";
            }
            case "read": {
                LedgerHandle lh = recoverer.openLedgerNoRecovery(Long.parseLong(a[1]), digestOf(a[1]), PASSWORD);
                int n = 0;
                Enumeration<LedgerEntry> entries = lh.readEntries(Long.parseLong(a[2]), Long.parseLong(a[3]));
                while (entries.hasMoreElements()) {
                    LedgerEntry e = entries.nextElement();
                    byte[] got = e.getEntry();
                    if (!java.util.Arrays.equals(payload(lh.getId(), e.getEntryId(), got.length), got)) {
                        throw new IllegalStateException("entry " + e.getEntryId() + " has another payload");
                    }
                    n++;
                }
                lh.close();
                return "{\"entries\": " + n + "}";
            }
            case "delete": {
                writer.deleteLedger(Long.parseLong(a[1]));
                return "{}";
            }
            default:
                throw new IllegalArgumentException("unknown command " + a[0]);
        }
    }

    /** The digest type the ledger's metadata names (a second client must open it with the same). */
    DigestType digestOf(String id) throws Exception {
        org.apache.bookkeeper.client.api.DigestType d = recoverer.getLedgerManager()
                .readLedgerMetadata(Long.parseLong(id)).get(30, TimeUnit.SECONDS).getValue().getDigestType();
        return DigestType.fromApiDigestType(d);
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    public static void main(String[] argv) throws Exception {
        if (argv.length != 1) {
            System.err.println("usage: LedgerTool METADATA_SERVICE_URI (commands on stdin)");
            System.exit(2);
        }
        PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true, "UTF-8");
        LedgerTool tool = new LedgerTool(argv[0]);
        out.println("{\"ready\": true}");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] a = line.trim().split("\\s+");
            if (a[0].isEmpty()) {
                continue;
            }
            if (a[0].equals("quit")) {
                break;
            }
            try {
                out.println(tool.run(a));
            } catch (Exception e) {
                out.println("{\"error\": " + quote(e.getClass().getSimpleName() + ": " + e.getMessage()) + "}");
            }
        }
        for (LedgerHandle lh : new ArrayList<>(tool.open.values())) {
            try {
                lh.close();
            } catch (Exception e) {
                // closing what is left is best effort: the test is over
            }
        }
        tool.writer.close();
        tool.recoverer.close();
    }
}
